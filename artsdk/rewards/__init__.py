"""Rewards: plain functions that score trajectories (``functions``: ``@art.reward``, and the
scoring that applies them), and ``art.Judge``, a judge model for when no rule can score."""

from .functions import Reward, RewardLike, as_reward, reward, score
from .judge import Judge

__all__ = ["Judge", "Reward", "RewardLike", "as_reward", "reward", "score"]
