"""The run: ``art.session`` and the ``Session`` it opens (``session``), ``art.gather`` (groups of
rollouts, ``gather``), the pipelined ``run.loop`` (``loop``), ``run.evaluate`` (``evaluate``)
and the progress they show (``progress``). The layer that runs things: it sits above rollouts,
rewards, capture and the store, and nothing below it imports it."""

from .evaluate import Evaluation
from .gather import gather
from .session import Session, session

__all__ = ["Evaluation", "Session", "gather", "session"]
