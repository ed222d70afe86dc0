"""The local backend: torch + transformers + peft on the CPU or one GPU."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
