"""The exceptions artsdk raises. Each message names the culprit and says what to do."""

from __future__ import annotations


class ArtError(Exception):
    """Base class of every error artsdk raises on purpose."""


class ConfigError(ArtError):
    """A setting is missing, malformed or names something that does not exist."""


class TrajectoryError(ArtError, ValueError):
    """A trajectory or message list does not have the shape artsdk needs."""


class RewardError(ArtError):
    """A reward function raised, or returned something that is not a finite number."""


class RolloutError(ArtError):
    """A rollout was used in a way that cannot work (not one whose agent code raised:
    that failure is recorded on the trajectory as ``trajectory.error``)."""


class CaptureError(ArtError):
    """An LLM call inside a rollout would escape capture, and ``strict_capture`` is on."""


class StoreError(ArtError):
    """The trajectory store cannot be opened, read or written."""


class ReplayError(ArtError):
    """A re-run of stored agent code made a call that the recording cannot answer."""


class BackendError(ArtError):
    """A training backend could not be found, started or reached."""


class ModelLoadError(BackendError):
    """A base model could not be found or loaded. (Its message can name files on the
    machine that tried: a server answers remote clients with a shorter one.)"""


class CheckpointError(BackendError):
    """A checkpoint on disk cannot be read (truncated, corrupt, half-copied). The message
    names its step and file and the newest step that can be read, ``readable`` (None when
    none can): ``art.session(model, resume=<that step>)`` continues from it."""

    def __init__(self, message: str, *, step: int, file: str, readable: "int | None") -> None:
        super().__init__(message)
        self.step, self.file, self.readable = step, file, readable


class TrainingError(ArtError):
    """A training step was refused or abandoned before any weight moved (a non-finite loss
    or gradient, say): the model, its served adapter and its checkpoints are unchanged."""


def first_error(exc: BaseException) -> BaseException:
    """The first leaf exception of a (nested) exception group, so users see
    ``RewardError: ...`` rather than ``ExceptionGroup: unhandled errors in a TaskGroup``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
