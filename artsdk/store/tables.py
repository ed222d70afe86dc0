"""The store's tables (SQLModel). Names start with ``art_`` so the store can share a team
database with other tables, and they live in their own registry so they never mix with a
user's own ``SQLModel.metadata``.

JSON columns hold text written by pydantic's serializer; times are UNIX seconds (REAL), cheap
to write and to filter on in every SQL dialect.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import Index
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

SCHEMA_VERSION = 2  # 2: runs (a run column, art_runs; steps and checkpoints keyed by run)
_registry = registry()


class _Table(SQLModel, registry=_registry):
    pass


metadata = _registry.metadata


class MetaRow(_Table, table=True):
    __tablename__ = "art_meta"
    key: str = Field(primary_key=True)
    value: str


class ProjectRow(_Table, table=True):
    __tablename__ = "art_projects"
    name: str = Field(primary_key=True)
    created_at: float


class ModelRow(_Table, table=True):
    __tablename__ = "art_models"
    project: str = Field(primary_key=True)
    name: str = Field(primary_key=True)
    base_model: str
    config: str = "{}"
    created_at: float


class RunRow(_Table, table=True):
    """One training run of a model: a session from the base model (or resumed from where an
    earlier run of it stopped), and everything it gathered and trained."""

    __tablename__ = "art_runs"
    project: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    run: str = Field(primary_key=True)
    base_model: str = ""
    started_at: float
    meta: str = "{}"


class StepRow(_Table, table=True):
    """One training step of a model in a run, with its metrics."""

    __tablename__ = "art_steps"
    project: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    run: str = Field(default="", primary_key=True)
    step: int = Field(primary_key=True)
    metrics: str = "{}"
    created_at: float


class GroupRow(_Table, table=True):
    __tablename__ = "art_groups"
    __table_args__ = (Index("ix_art_groups_pms", "project", "model", "step"),)
    id: str = Field(primary_key=True)
    project: Optional[str] = Field(default=None, index=True)
    model: Optional[str] = None
    run: Optional[str] = None
    step: Optional[int] = None
    rollout: str = ""
    scenario: str = "null"
    size: int = 0
    reward_mean: Optional[float] = None
    reward_std: Optional[float] = None
    no_signal: bool = False
    created_at: float


class TrajectoryRow(_Table, table=True):
    __tablename__ = "art_trajectories"
    __table_args__ = (Index("ix_art_traj_pms", "project", "model", "step"),
                      Index("ix_art_traj_pmrs", "project", "model", "run", "step"),
                      # newest-first pages (trajectories(..., newest_first=True), `artsdk trajectories list`)
                      Index("ix_art_traj_p_started", "project", "started_at"),
                      Index("ix_art_traj_pm_started", "project", "model", "started_at"),
                      Index("ix_art_traj_pmr_started", "project", "model", "run", "started_at"))
    id: str = Field(primary_key=True)
    project: Optional[str] = None
    model: Optional[str] = None
    run: Optional[str] = None
    step: Optional[int] = None
    group_id: Optional[str] = Field(default=None, index=True)
    group_index: Optional[int] = None
    rollout: str = ""
    attempt: int = 0
    scenario: str = "null"
    outcome: str = "null"
    reward: Optional[float] = Field(default=None, index=True)
    error_type: Optional[str] = None
    error_message: Optional[str] = None
    traceback: Optional[str] = None
    warnings: str = "[]"
    meta: str = "{}"
    started_at: float = Field(index=True)
    ended_at: Optional[float] = None
    duration: float = 0.0
    n_calls: int = 0


class CallRow(_Table, table=True):
    """One LLM call. ``messages`` holds only the messages not already in the previous
    call's conversation; ``prefix`` says how many messages it inherits from there."""

    __tablename__ = "art_calls"
    trajectory_id: str = Field(primary_key=True)
    idx: int = Field(primary_key=True)
    provider: str = "openai"
    model: str = ""
    served_by: Optional[str] = None
    step: Optional[int] = None
    prefix: int = 0
    messages: str = "[]"
    tools: Optional[str] = None
    params: str = "{}"
    usage: Optional[str] = None
    prompt_token_ids: Optional[str] = None
    latency: float = 0.0
    stream: bool = False
    incomplete: bool = False
    error: Optional[str] = None


class ChoiceRow(_Table, table=True):
    __tablename__ = "art_choices"
    trajectory_id: str = Field(primary_key=True)
    call_idx: int = Field(primary_key=True)
    idx: int = Field(primary_key=True)
    message: str = "{}"
    finish_reason: Optional[str] = None
    token_ids: Optional[str] = None
    logprobs: Optional[str] = None


class RewardRow(_Table, table=True):
    __tablename__ = "art_rewards"
    trajectory_id: str = Field(primary_key=True)
    name: str = Field(primary_key=True)
    value: float


class CheckpointRow(_Table, table=True):
    __tablename__ = "art_checkpoints"
    project: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    run: str = Field(default="", primary_key=True)
    step: int = Field(primary_key=True)
    path: str = ""
    metrics: str = "{}"
    created_at: float


TRAJECTORY_CHILDREN = (CallRow, ChoiceRow, RewardRow)
