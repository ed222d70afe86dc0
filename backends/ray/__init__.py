"""The ray backend: inference replicas and trainer ranks on a Ray cluster (``backend = "ray"``)."""

from .backend import RayBackend

__all__ = ["RayBackend"]
