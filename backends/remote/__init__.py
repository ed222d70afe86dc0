"""The remote backend: `artsdk serve` on one machine, `RemoteBackend` on another."""

from .client import RemoteBackend

__all__ = ["RemoteBackend"]
