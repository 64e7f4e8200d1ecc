"""The one place where a child's environment is built (cleared < policy < request)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["build_child_env"]


def build_child_env(
    base: Mapping[str, str] | None = None,
    policy_env: Mapping[str, str] | None = None,
    request_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return the environment for a child process.

    ``base`` is what the cleared environment starts from: nothing for a host process (no host variable,
    so no secret, reaches the child), or a container image's own defaults (PATH, HOME, LANG). Later layers
    override earlier ones: base < policy env < request env.
    """
    env: dict[str, str] = {}
    for layer in (base, policy_env, request_env):
        if layer:
            env.update(layer)
    return env
