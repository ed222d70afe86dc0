"""From scored groups to the token rows a GRPO step trains on: each scored trajectory's
advantage; its calls as token segments (context, and the tokens this model sampled, with
the sampler's logprobs and the step that sampled them); the weight of each trained token
under the loss's normalisation; the split into mini-batches; and segments packed into rows.

Only tokens this model sampled are trained (their recorded ids), in the calls it served
(``served_by`` names it); prompts, tool results, user turns, other models' answers, the
choices of an ``n > 1`` call the agent did not go on with, and tokens sampled more than
``max_policy_lag`` steps ago are context. Several trajectories share a row (no padding to
the longest); each segment's position ids restart at 0 and attention never crosses from one
segment to the next (attention.py).
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from artsdk.errors import TrajectoryError
from artsdk.trajectory.response_items import whole_conversation
from artsdk.trajectory import Choice, Group, LLMCall, Trajectory

from .engine import MIN_TEMPERATURE

log = logging.getLogger("artsdk.local")

# added to a group's standard deviation before dividing by it (as TRL): a group whose rewards
# differ only by a tie-break (0 and 1e-5) gets advantages near 0, not a full +-0.7
STD_EPSILON = 1e-4


def advantages(groups: Sequence[Group], scale: bool) -> tuple[list[tuple[Trajectory, float]], int]:
    """(trajectory, advantage) of every scored trajectory -- 0 in a group with no signal --
    and how many groups had none (all rewards equal). The advantage is the reward minus the
    group's mean, divided (``scale``) by the group's standard deviation (Bessel's) + 1e-4."""
    out, silent = [], 0
    for g in groups:
        scored = g.scored
        for t in scored:
            if not isinstance(t.reward, (int, float)) or not math.isfinite(t.reward) or abs(t.reward) > 1e30:
                parts = [f"{k!r} is {v!r}" for k, v in t.rewards.items()
                         if not isinstance(v, (int, float)) or not math.isfinite(v)]
                why = f" (its reward part {', '.join(parts)})" if parts else ""
                raise TrajectoryError(f"trajectory {t.id} has reward {t.reward!r}{why}: rewards must be finite "
                                      f"numbers (check the reward functions); nothing was trained")
        if g.no_signal:
            silent += 1
            out.extend((t, 0.0) for t in scored)
            continue
        r = torch.tensor([t.reward for t in scored], dtype=torch.float64)
        a = r - r.mean()
        if scale:
            a = a / (r.std(unbiased=True) + STD_EPSILON)
        out.extend((t, float(x)) for t, x in zip(scored, a))
    return out, silent


def is_policy_call(call: LLMCall, policy: str) -> bool:
    """True when ``policy`` answered this call (``served_by`` is ``policy`` or ``policy@step``;
    a hand-made call without ``served_by`` is judged by the model it asked for)."""
    return (call.served_by or call.model or "").partition("@")[0] == policy


def temperature_of(call: LLMCall) -> float:
    """The temperature a call sampled at (1 when unset; greedy calls are scored at 1), as
    the engine applied it."""
    t = call.params.get("temperature")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
        return 1.0
    return max(float(t), MIN_TEMPERATURE)


@dataclass
class Tokenizing:
    """What turning a trajectory into tokens needs from the model being trained."""

    policy: str  # the model's name: only calls it served are trained
    prompt_ids: Callable[[list[Any], Any], list[int]]  # (messages, tools): fallback when a call has no prompt ids
    completion_ids: Callable[[Any], list[int]]  # fallback when a choice has no sampled ids
    vocab_size: int
    context_length: int
    step: int = 0  # the model's step now: a call's lag is this minus the step that answered it
    max_policy_lag: Optional[int] = None  # tokens sampled more than this many steps ago are context
    warn: Callable[[str], None] = log.warning


@dataclass
class Segment:
    """One token sequence of one trajectory: context and the tokens its calls sampled."""

    tokens: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)  # nan: not recorded
    temperature: list[float] = field(default_factory=list)
    advantage: float = 0.0
    trajectory: int = 0  # which scored trajectory of the step it belongs to
    weight: float = 0.0  # of each trained token in the loss

    def extend(self, ids: Sequence[int], trained: bool, logprobs: Optional[Sequence[float]] = None,
               temperature: float = 1.0) -> None:
        self.tokens.extend(ids)
        self.trained.extend([trained] * len(ids))
        self.sampler_logprobs.extend(logprobs if logprobs is not None else [math.nan] * len(ids))
        self.temperature.extend([temperature] * len(ids))

    @property
    def n_trained(self) -> int:
        return sum(self.trained)


@dataclass
class Tokens:
    """A trajectory as tokens: its segments, how many of its calls another model answered,
    the lag (in steps) of each call of this model, and the sampled tokens left untrained for
    being older than ``max_policy_lag``."""

    segments: list[Segment]
    other_calls: int = 0
    lags: list[int] = field(default_factory=list)
    stale_tokens: int = 0


def _arguments(value: Any) -> Any:
    """Tool-call arguments compared by what they say: a JSON string and its parse are equal."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _said(m: Any) -> tuple[Any, Any]:
    """A message by its content and full tool calls (names and arguments)."""
    if not isinstance(m, dict):
        return (m, None)
    calls = [((tc.get("function") or {}).get("name"), _arguments((tc.get("function") or {}).get("arguments")))
             for tc in m.get("tool_calls") or () if isinstance(tc, dict)]
    return (m.get("content") or None, calls or None)


def continued_choice(calls: Sequence[LLMCall], n: int) -> Choice:
    """The answer of call ``n`` the agent went on with: with several choices (``n > 1``), the
    one whose sampled tokens a later call's prompt carries after this call's prompt, else the
    one whose message (content and tool calls with their arguments) a later call's
    conversation carries after this call's messages; the first when none is found."""
    call = calls[n]
    if len(call.choices) < 2:
        return call.choices[0]
    at, p = len(call.messages), call.prompt_token_ids
    for later in calls[n + 1:]:
        q = later.prompt_token_ids
        if p and q and len(q) > len(p) and q[:len(p)] == p:
            tail = q[len(p):]
            by_tokens = [c for c in call.choices if c.token_ids and tail[:len(c.token_ids)] == list(c.token_ids)]
            if by_tokens:
                return max(by_tokens, key=lambda c: len(c.token_ids or ()))
        if len(later.messages) > at and later.messages[:at] == call.messages:
            said = _said(later.messages[at])
            found = [c for c in call.choices if _said(c.message) == said]
            if found:
                return found[0]
    return call.choices[0]


def segments(traj: Trajectory, advantage: float, tk: Tokenizing) -> Tokens:
    """The token sequences of one trajectory. A call whose prompt extends the previous call's
    tokens continues the same sequence (multi-turn in one row); otherwise a new one starts."""
    out = Tokens(segments=[])
    cur: Optional[Segment] = None
    for n, call in enumerate(traj.calls):
        if not call.choices or call.error or call.params.get("judge"):
            continue  # a judge's call scored the trajectory: not part of it, never trained
        if not is_policy_call(call, tk.policy):
            out.other_calls += 1  # its answer reaches training only as context of a later call's prompt
            continue
        choice = continued_choice(traj.calls, n)
        prompt = call.prompt_token_ids
        if not prompt:
            tk.warn("a call has no prompt token ids: retokenizing its messages")
            prompt = tk.prompt_ids(whole_conversation(traj.calls, call), call.tools)
        if choice.trainable:
            ids, lps = list(choice.token_ids), list(choice.logprobs)  # type: ignore[arg-type]
            bad = next((x for x in lps if not math.isfinite(x) or x > 1e-3), None)
            if bad is not None:
                raise TrajectoryError(f"trajectory {traj.id}, call {n}: sampled logprob {bad!r} is not a "
                                      f"finite log-probability; nothing was trained")
        else:
            tk.warn("a choice has no sampled token ids/logprobs: retokenizing its text (no sampler correction)")
            ids, lps = tk.completion_ids(choice), None
        wrong = next((x for x in (*prompt, *ids) if isinstance(x, bool) or not isinstance(x, int)
                      or not 0 <= x < tk.vocab_size), None)
        if wrong is not None:
            raise TrajectoryError(f"trajectory {traj.id}, call {n}: token id {wrong!r} is outside the model's "
                                  f"vocabulary (0..{tk.vocab_size - 1}); was it sampled by another model? "
                                  f"Nothing was trained")
        lag = max(tk.step - call.step, 0) if call.step is not None else 0
        trained = tk.max_policy_lag is None or lag <= tk.max_policy_lag
        if trained:
            out.lags.append(lag)
        else:
            out.stale_tokens += len(ids)
        if cur is not None and len(prompt) >= len(cur.tokens) and prompt[:len(cur.tokens)] == cur.tokens:
            cur.extend(prompt[len(cur.tokens):], False)
        else:
            cur = Segment(advantage=advantage)
            out.segments.append(cur)
            cur.extend(prompt, False)
        cur.extend(ids, trained, lps, temperature_of(call))
        if len(cur.tokens) > tk.context_length:
            raise TrajectoryError(f"trajectory {traj.id}, call {n}: {len(cur.tokens)} tokens, longer than the "
                                  f"model's context of {tk.context_length}; shorten the conversation (the "
                                  f"server refuses such prompts too). Nothing was trained")
    return out


def weigh(trajectories: Sequence[list[Segment]], norm: str, max_completion_tokens: int,
          token_share: Optional[float] = None) -> None:
    """Set every segment's per-token weight so that the loss is the chosen normalisation's
    mean over ``trajectories`` (one mini-batch's scored trajectories, those with advantage 0
    included):

    - ``token``: every trained token weighs ``1 / token_share``: the step's trained tokens
      (all mini-batches') divided by its number of mini-batches, as TRL divides DAPO's and
      CISPO's loss -- each token of the step weighs the same, whichever mini-batch it is in;
      without ``token_share``, the trained tokens of these trajectories;
    - ``sequence``: a trajectory's tokens weigh 1 / (N |o|), |o| its trained tokens over all
      its segments (a multi-turn trajectory split in two weighs what it would in one);
    - ``constant``: every token weighs 1 / (N max_completion_tokens).
    """
    n = max(len(trajectories), 1)
    counts = [sum(s.n_trained for s in segs) for segs in trajectories]
    total = max(token_share if token_share is not None else sum(counts), 1)
    for segs, count in zip(trajectories, counts):
        w = {"token": 1.0 / total, "sequence": 1.0 / (n * max(count, 1)),
             "constant": 1.0 / (n * max_completion_tokens)}[norm]
        for s in segs:
            s.weight = w


def minibatches(n: int, k: int, seed: int) -> list[list[int]]:
    """``range(n)`` shuffled (seeded) and cut into ``min(k, n)`` nearly equal mini-batches, so
    each mixes trajectories of several groups (TRL shuffles its generation batch too)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = max(1, min(k, n))
    return [order[i * n // k:(i + 1) * n // k] for i in range(k)]


def pack(units: Sequence[list[Segment]], budget: int) -> list[list[Segment]]:
    """First-fit decreasing: rows whose lengths add up to at most ``budget``. A trajectory's
    segments stay in one row when they fit in one; a longer trajectory's segments are packed
    one by one (a segment longer than ``budget`` gets a row of its own)."""
    items: list[list[Segment]] = []
    for u in units:
        if sum(len(s.tokens) for s in u) <= budget:
            items.append(list(u))
        else:
            items.extend([s] for s in u)
    rows: list[list[Segment]] = []
    room: list[int] = []
    for item in sorted(items, key=lambda it: -sum(len(s.tokens) for s in it)):
        n = sum(len(s.tokens) for s in item)
        for i, free in enumerate(room):
            if n <= free:
                rows[i].extend(item)
                room[i] -= n
                break
        else:
            rows.append(list(item))
            room.append(budget - n)
    return rows
