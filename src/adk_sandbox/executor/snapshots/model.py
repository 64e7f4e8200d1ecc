"""What a snapshot is: :class:`Snapshot` (the record, immutable), :class:`SnapshotOptions` (how to take one).

A snapshot is a session's files at one moment (workspace, tmpfs archives, the task profile's root layer)
or, with ``processes=True``, its checkpoint (:class:`KeptProcesses`); :attr:`Snapshot.carries` says
which. Owner and expiry use the labels of :mod:`adk_sandbox.executor._owner`.
See docs/snapshots.md, sections "What a snapshot holds" and "Lifecycle".
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adk_sandbox.executor import _owner

__all__ = [
    "DEFAULT_MAX_MB",
    "DEFAULT_TTL_SECONDS",
    "MAX_NOTES",
    "MAX_NOTE_CHARS",
    "MAX_TTL_SECONDS",
    "SNAPSHOT_ID",
    "SNAPSHOT_LABEL",
    "CopyMethod",
    "KeptProcesses",
    "Snapshot",
    "SnapshotOptions",
    "cap_notes",
]

#: The label that names the snapshot an engine image holds the root layer of.
SNAPSHOT_LABEL = _owner.LABEL_PREFIX + "snapshot"
#: A snapshot id: what this library makes (``snap-`` and 16 hex digits); names are checked the same way.
SNAPSHOT_ID = re.compile(r"snap-[0-9a-f]{16}")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
#: User labels as a backend's containers take them (docs/docker/configuration.md, "User labels").
_LabelKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,254}$")]
_Labels = Annotated[
    dict[_LabelKey, Annotated[str, Field(strict=True, max_length=4096)]], Field(max_length=64)
]

#: A snapshot lives a day unless asked otherwise, at most 30 days.
DEFAULT_TTL_SECONDS = 24 * 3600
MAX_TTL_SECONDS = 30 * 24 * 3600
#: The default cap on a snapshot's size (workspace files + tmpfs archives + root layer), in MiB.
DEFAULT_MAX_MB = 4096

#: At most this many notes in :attr:`Snapshot.skipped` (the last of them then says how many more were left
#: out), each at most ``MAX_NOTE_CHARS`` characters: a sandbox decides how many notes there are (one per
#: link leading out of its workspace) and how long (a link's target, a line of its tar's complaints), and a
#: record must stay well under what the store reads of one (docs/snapshots.md, "Lifecycle").
MAX_NOTES = 100
MAX_NOTE_CHARS = 300


def cap_notes(notes: Iterable[str]) -> tuple[str, ...]:
    """``notes`` as a snapshot records them: the first :data:`MAX_NOTES`, each cut to :data:`MAX_NOTE_CHARS`.

    Past :data:`MAX_NOTES` the last kept place says how many were left out (``"… and N more"``). Capped
    notes are their own cap (a record read back is not cut again).
    """
    kept: list[str] = []
    more = 0
    for note in notes:
        if len(kept) < MAX_NOTES:
            kept.append(note if len(note) <= MAX_NOTE_CHARS else note[: MAX_NOTE_CHARS - 1] + "…")
        else:
            more += 1
    if more:
        kept[-1] = f"… and {more + 1} more"
    return tuple(kept)


#: How the workspace was copied: by reflink (shared blocks, copy-on-write), by a plain copy, or not at all
#: (the session had no workspace). A copy that cloned some files and copied others says ``"copy"``.
CopyMethod = Literal["reflink", "copy", "none"]


class SnapshotOptions(BaseModel):
    """How to take a snapshot (``session.snapshot(...)``, ``session.fork(...)``): checked before anything."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(pattern=_NAME)] | None = None
    """A name to find it by (letters, digits, ``_.-``, at most 64); default: its id."""
    labels: _Labels = Field(default_factory=dict)
    """User labels (as ``DockerBackend(labels=...)``: no key in this project's namespace, at most 64)."""
    ttl_seconds: Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS)] = DEFAULT_TTL_SECONDS
    """Seconds until it expires: any reaper then removes it."""
    detached: bool = False
    """False: owned by this process, removed by a reaper once the process is gone (or it expired). True:
    no owner, it outlives this process until it expires or is removed (``adk-sandbox snapshots rm``)."""
    max_mb: Annotated[int, Field(ge=1, le=1 << 20)] = DEFAULT_MAX_MB
    """The cap on its size in MiB; a snapshot over it is refused and nothing of it is kept."""
    wait_seconds: Annotated[float, Field(ge=0, le=3600)] = 60.0
    """How long to wait for the session's running commands to end before refusing."""

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if key.lower().startswith(_owner.LABEL_PREFIX):
                # The reaper trusts these to decide what it may remove.
                raise ValueError(f"label {key!r} is in this project's namespace ({_owner.LABEL_PREFIX}*)")
        return labels


class KeptEndpoint(BaseModel):
    """The proxy endpoint a sandbox's agent listens on, kept with a copy of its memory (no secret in it).

    Host-side records only, never read from the sandbox: whose agent listens, its LISTEN channels, and the
    port its commands were told. A session restored from the copy serves it again under its own network.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    user: Annotated[str, Field(pattern=r"^[0-9]{1,10}:[0-9]{1,10}$")]
    listeners: tuple[Annotated[int, Field(ge=1, lt=1 << 32)], ...]
    port: Annotated[int, Field(ge=1, le=65535)]


class KeptProcesses(BaseModel):
    """What a snapshot with processes keeps beside the sandbox's checkpoint (``checkpoint/``).

    The checkpoint holds every process, the in-sandbox agent among them; this is what the host needs to
    serve that agent again in a session restored from it (its user, HELLO, and where its channel numbers
    were: they go on, never reused).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint: Annotated[str, Field(pattern=r"^adk-[0-9a-f]{16}$")]
    """The engine's name of the checkpoint (sessions from the snapshot restore a copy under it)."""
    user: Annotated[str, Field(pattern=r"^[0-9]{1,10}:[0-9]{1,10}$")]
    """The agent's user (``"uid:gid"``): the keeper's child."""
    hello: dict[str, Any]
    """What the agent said when it started."""
    numbering: tuple[int, int, int]
    """The agent's next channel, highest connection and next dial when the checkpoint was taken."""
    endpoint: KeptEndpoint | None = None
    """The network policy's proxy endpoint its agent held (None: it served none)."""


class Snapshot(BaseModel):
    """A session's files at one moment, on disk (docs/snapshots.md, "What a snapshot holds"); immutable.

    Read it from :attr:`path` only through this library: ``workspace/`` is a safe copy (no set-id bit, no
    link leading out, no special file), ``tmpfs/<n>.tar`` are the sandbox's archives, opaque to the host.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Annotated[str, Field(pattern=SNAPSHOT_ID.pattern)]
    name: Annotated[str, Field(pattern=_NAME)]
    labels: dict[str, str] = Field(default_factory=dict)
    """The user labels it was taken with."""
    created: float
    """When it was taken (seconds since the epoch)."""
    expires: int
    """When any reaper may remove it (seconds since the epoch)."""
    owner: dict[str, str] = Field(default_factory=dict)
    """The owner labels of the process that owns it (empty: detached, only :attr:`expires` applies)."""
    backend: Literal["docker", "microvm"] = "docker"
    """The backend whose sessions can start from it (a microVM's: its machine file, ``checkpoint/``)."""
    image: str
    """The image the session ran (by name): sessions from the snapshot run it (or :attr:`root_image`)."""
    image_id: str
    """The id of that image when the snapshot was taken."""
    profile: str
    """The session's profile (``"hardened"`` or ``"task"``)."""
    runtime: str | None = None
    workspace: str | None = None
    """Where the workspace is inside the sandbox (every session from this snapshot has it there), or None."""
    tmpfs: tuple[str, ...] = ()
    """The tmpfs directories archived, in the order of the archives ``tmpfs/0.tar``, ``tmpfs/1.tar``..."""
    tmpfs_format: Literal["tar", "tree"] = "tar"
    """How the tmpfs directories are kept: ``"tar"``, archives made inside the sandbox (``tmpfs/<n>.tar``,
    never unpacked on the host); ``"tree"``, host copies of a forkable session's tmpfs volumes
    (``tmpfs/<n>/``, made by the workspace's safe walk)."""
    root_image: str | None = None
    """The engine image holding the root layer (task profile), or None."""
    root_archive: bool = False
    """The root layer (task profile, gVisor) is ``root.tar`` + ``root.dirs``: changes read from inside."""
    method: CopyMethod = "none"
    """How the workspace was copied into the snapshot."""
    size_bytes: int = 0
    """Workspace files + tmpfs archives + the root layer's size as the engine reported it."""
    skipped: tuple[str, ...] = ()
    """What was left out of it, and why (links leading out, special files, unreadable tmpfs files): at most
    :data:`MAX_NOTES` notes of at most :data:`MAX_NOTE_CHARS` characters (:func:`cap_notes`)."""
    carries: tuple[Literal["files", "processes", "memory"], ...] = ("files",)
    """What it restores: ``("files",)``, or with :attr:`processes` every process and its memory too."""
    processes: KeptProcesses | None = None
    """Set for a container's snapshot with processes: its processes and files are the checkpoint in
    ``checkpoint/`` (the sandbox's memory, tmpfs and root writes under gVisor), besides the workspace copy
    (if any). A microVM's (:attr:`backend`) describes its agents in ``checkpoint/machine.json`` instead."""
    path: str = ""
    """Its directory on disk (set when it is read from its store)."""

    @field_validator("skipped")
    @classmethod
    def _cap_skipped(cls, skipped: tuple[str, ...]) -> tuple[str, ...]:
        # The one place the notes are capped, whoever made them (the store validates what it writes).
        return cap_notes(skipped)

    @property
    def workspace_dir(self) -> str:
        """The host directory holding the workspace copy (exists only when :attr:`workspace` is set)."""
        return os.path.join(self.path, "workspace")

    @property
    def checkpoint_dir(self) -> str:
        """The host directory holding the sandbox's checkpoint (exists only when :attr:`processes` is set)."""
        return os.path.join(self.path, "checkpoint")

    def archive(self, index: int) -> str:
        """The archive of the tmpfs directory ``tmpfs[index]`` (``tmpfs_format == "tar"``)."""
        return os.path.join(self.path, "tmpfs", f"{index}.tar")

    def tree(self, index: int) -> str:
        """The host copy of the tmpfs directory ``tmpfs[index]`` (``tmpfs_format == "tree"``)."""
        return os.path.join(self.path, "tmpfs", str(index))

    def engine_labels(self) -> dict[str, str]:
        """The labels of its engine image: project, snapshot id, owner (or none), expiry, user labels."""
        detached = {key: "" for key in (_owner.OWNER_PID, _owner.OWNER_START, _owner.OWNER_BOOT)}
        return {
            **self.labels,
            **(self.owner or detached),  # "" overrides what the image would inherit from the container
            _owner.PROJECT_LABEL: "adk-sandbox",
            SNAPSHOT_LABEL: self.id,
            _owner.EXPIRES: str(self.expires),
        }

    def leak_reason(self, now: float | None = None) -> str | None:
        """Why a reaper may remove it (expired, or its owner process is gone), or None."""
        return _owner.leak_reason(self.engine_labels(), time.time() if now is None else now)


def owner_of_now() -> dict[str, str]:
    """The owner labels a snapshot taken now by this process carries."""
    labels = _owner.owner_labels("snapshot", 0)
    keys = (_owner.OWNER_PID, _owner.OWNER_START, _owner.OWNER_BOOT, _owner.OWNER_HOST, _owner.OWNER_PIDNS)
    return {key: labels[key] for key in keys}


def new_record(options: SnapshotOptions, snapshot_id: str, created: float, **fields: Any) -> Snapshot:
    """The record of a snapshot taken at ``created`` with ``options``, and the engine's ``fields``.

    Its name, labels and expiry come from ``options``; its owner is this process, unless detached.
    """
    return Snapshot(
        id=snapshot_id,
        name=options.name or snapshot_id,
        labels=options.labels,
        created=created,
        expires=int(created) + options.ttl_seconds,
        owner={} if options.detached else owner_of_now(),
        **fields,
    )


def options_from(**given: object) -> SnapshotOptions:
    """:class:`SnapshotOptions` from keyword arguments (None: the default); :class:`InvalidRequestError`."""
    from pydantic import ValidationError  # noqa: PLC0415

    from adk_sandbox.executor.errors import InvalidRequestError, validation_problems  # noqa: PLC0415

    try:
        return SnapshotOptions.model_validate(
            {key: value for key, value in given.items() if value is not None}
        )
    except ValidationError as exc:
        problems = validation_problems(exc, "options")
        raise InvalidRequestError(f"invalid snapshot options: {problems}") from None
