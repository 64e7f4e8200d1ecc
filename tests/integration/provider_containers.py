"""The containers the inspect provider made, for the tests that check an eval leaves none behind."""

from __future__ import annotations

import docker


def provider_containers(label: str) -> set[str]:
    """The ids of every container (running or not) labelled ``label=adk-sandbox`` (the provider's label)."""
    client = docker.from_env()
    try:
        wanted = f"{label}=adk-sandbox"
        return {c.id for c in client.containers.list(all=True, sparse=True, filters={"label": wanted})}
    finally:
        client.close()
