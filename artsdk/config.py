"""Settings, from weakest to strongest: defaults, ``artsdk.toml`` (or ``[tool.artsdk]`` in
``pyproject.toml``) found in the working directory or a parent, ``ARTSDK_*`` environment
variables, and ``art.configure(...)``.

```toml
# artsdk.toml
project = "tic-tac-toe"
store = "sqlite:///runs/store.db"     # or a path, or any SQLAlchemy URL
backend = "local"                     # or "remote", or any installed backend

[backend_options]
device = "cpu"
```
"""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError

ENV_PREFIX = "ARTSDK_"
# ARTSDK_* variables that are not settings but are read where they are needed
OTHER_VARIABLES = {"ARTSDK_CACHE": "the local backend's cache of converted base models",
                   "ARTSDK_VIEW_KEY": "the key `artsdk view` requires"}


class Settings(BaseModel):
    """The effective configuration. Read it with ``art.settings()``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    project: str = Field(default_factory=lambda: Path.cwd().name or "default",
                         description="Project name trajectories and models are filed under.")
    home: str = Field(".artsdk", description="Folder for the default store, checkpoints, caches.")
    store: Optional[str] = Field(None, description="Store URL or SQLite path; default <home>/store.db.")
    backend: str = Field("local", description="Backend name (entry point in 'artsdk.backends').")
    backend_url: Optional[str] = Field(None, description="URL of an `artsdk serve` server.")
    api_key: Optional[str] = Field(None, description="API key for the backend server.")
    backend_options: dict[str, Any] = Field(default_factory=dict)
    concurrency: int = Field(32, ge=1, description="Default number of rollouts run at once.")
    progress: Optional[bool] = Field(None, description="Progress of gathers and training steps: a bar on a "
                                                       "terminal, a line every 30 s otherwise (default); false: quiet.")
    record_calls: bool = Field(False, description="Store trajectories of plain (not .collect) calls.")
    strict_capture: bool = Field(False, description="Refuse an LLM call that would escape capture (CaptureError).")
    trackers: list[str] = Field(default_factory=list, description="Where training metrics go: tensorboard, wandb, mlflow.")
    tracker_options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Options of each tracker.")
    config_file: Optional[str] = Field(None, description="The file these settings were read from.")

    @property
    def store_url(self) -> str:
        """The store as an SQLAlchemy URL (a bare path means an SQLite file)."""
        s = self.store or str(Path(self.home) / "store.db")
        return s if "://" in s else f"sqlite:///{s}"


_lock = threading.Lock()
_overrides: dict[str, Any] = {}
_cached: Optional[Settings] = None
_listeners: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` each time ``configure`` changes the settings (the default store
    registers itself here, to be reopened from the new ones)."""
    _listeners.append(listener)


def _find_file(start: Path) -> tuple[Optional[Path], dict[str, Any]]:
    for folder in (start, *start.parents):
        for name, section in (("artsdk.toml", None), ("pyproject.toml", ("tool", "artsdk"))):
            path = folder / name
            if not path.is_file():
                continue
            try:
                data = tomllib.loads(path.read_text())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
                raise ConfigError(f"{path} is not valid TOML: {e}") from e
            if section is None:
                return path, data
            sub = data.get(section[0], {}).get(section[1])
            if sub is not None:
                return path, sub
    return None, {}


def _from_env() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in os.environ.items():
        if not key.startswith(ENV_PREFIX) or key in OTHER_VARIABLES:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in Settings.model_fields or name == "config_file":
            known = sorted(f"{ENV_PREFIX}{k.upper()}" for k in Settings.model_fields if k != "config_file")
            raise ConfigError(f"unknown environment variable {key}: not an artsdk setting; known: "
                              f"{', '.join(known + sorted(OTHER_VARIABLES))} (unset it, or fix its spelling)")
        if name in ("backend_options", "tracker_options"):
            import json

            try:
                out[name] = json.loads(value)
            except ValueError as e:
                raise ConfigError(f"{key} must be a JSON object, got {value!r}") from e
        elif name == "trackers":  # a comma-separated list
            out[name] = [x.strip() for x in value.split(",") if x.strip()]
        else:
            out[name] = value
    return out


def load() -> Settings:
    """Read the settings afresh from files, environment and ``configure()`` overrides."""
    path, from_file = _find_file(Path.cwd())
    unknown = set(from_file) - set(Settings.model_fields)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {sorted(unknown)} in {path}; "
            f"known: {sorted(k for k in Settings.model_fields if k != 'config_file')}"
        )
    merged = {**from_file, **_from_env(), **_overrides}
    if path is not None:
        merged["config_file"] = str(path)
    try:
        settings = Settings(**merged)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"setting {field!r} is invalid: {first['msg']} "
                          f"(value {first.get('input')!r})") from None
    if path is not None:
        # relative paths written in a config file are relative to that file, not to the cwd
        # (run from a subfolder, the same store and home are used)
        home_given = "home" in _overrides or "home" in _from_env()
        if not home_given and not Path(settings.home).is_absolute():  # from the file, or the default
            settings.home = str(path.parent / settings.home)
        store = from_file.get("store")
        store_given = "store" in _overrides or "store" in _from_env()
        if store and not store_given and "://" not in store and not Path(store).is_absolute():
            settings.store = str(path.parent / store)
    return settings


def settings() -> Settings:
    """The effective settings (cached; ``configure()`` refreshes them)."""
    global _cached
    cached = _cached  # (read on every plain call of a rollout: the lock only to make them)
    if cached is not None:
        return cached
    with _lock:
        if _cached is None:
            _cached = load()
        return _cached


def configure(**overrides: Any) -> Settings:
    """Override settings for this process, e.g. ``art.configure(store="runs.db")``.
    Passing ``None`` removes an override. Returns the new effective settings."""
    global _cached
    unknown = set(overrides) - set(Settings.model_fields)
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(Settings.model_fields)}")
    with _lock:
        for k, v in overrides.items():
            if v is None:
                _overrides.pop(k, None)
            else:
                _overrides[k] = v
        _cached = None
    for listener in list(_listeners):
        listener()
    return settings()
