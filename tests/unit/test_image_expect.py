"""The image-id rule of a session (issue 13): which ids match, what a mismatch says, what a pin must be."""

from __future__ import annotations

import pytest

from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.docker.images import ExpectedImage, image_mismatch
from adk_sandbox.executor.errors import InvalidRequestError

ID = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def test_the_same_id_matches_with_or_without_its_prefix() -> None:
    assert image_mismatch({"Image": ID}, "img", ExpectedImage(ID, pinned=True)) is None
    bare = {"Image": ID.removeprefix("sha256:")}
    assert image_mismatch(bare, "img", ExpectedImage(ID, pinned=True)) is None


def test_a_mismatch_names_both_ids_and_the_way_out() -> None:
    pinned = image_mismatch({"Image": OTHER}, "img", ExpectedImage(ID, pinned=True))
    assert pinned is not None and "cdcdcdcdcdcd" in pinned and "abababababab (the pinned image_id)" in pinned
    local = image_mismatch({"Image": OTHER}, "img", ExpectedImage(ID, pinned=False))
    assert local is not None and "adk-sandbox images push --engine ENGINE" in local


@pytest.mark.parametrize("bad", ["latest", "sha256:abc", "sha512:" + "ab" * 32, ID.upper()])
def test_a_pin_must_be_an_image_id(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match="image_id must be an image id"):
        DockerBackend(image_id=bad)
