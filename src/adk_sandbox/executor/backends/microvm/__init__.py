"""MicroVMBackend: one QEMU microvm per session, commands through the static agent (docs/MICROVM.md)."""

from adk_sandbox.executor.backends.microvm.backend import MicroVMBackend, MicroVMSession, resolve_accel
from adk_sandbox.executor.backends.microvm.config import MicroVMConfig, MicroVMPoolConfig
from adk_sandbox.executor.backends.microvm.pool import MicroVMPool, PoolStats

__all__ = [
    "MicroVMBackend",
    "MicroVMConfig",
    "MicroVMPool",
    "MicroVMPoolConfig",
    "MicroVMSession",
    "PoolStats",
    "resolve_accel",
]
