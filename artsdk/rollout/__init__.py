"""The rollout: ``@art.rollout`` turning agent code into trajectories (``decorator``), and the
reconciling of what the client recorded with what the endpoint served, with the per-rollout
address a child process or another tool calls through (``reconcile``)."""

from .decorator import Args, Rollout, rollout
from .reconcile import bind, rollout_env, rollout_url

__all__ = ["Args", "Rollout", "bind", "rollout", "rollout_env", "rollout_url"]
