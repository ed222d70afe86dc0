"""What a rollout leaves behind: its LLM calls, outcome, rewards and errors.

Messages are kept as OpenAI-format dicts (``{"role": "user", "content": "hi"}``), the shape
agent code already uses, so ``traj.messages[-1]["content"]`` reads the way it was written.
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ..errors import CaptureError, TrajectoryError
from .response_items import plain

Message = dict[str, Any]
"""One chat message in OpenAI format: ``{"role": ..., "content": ..., "tool_calls": ...}``."""

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

T = TypeVar("T")


_UUID4 = (0x4 << 76) | (0x2 << 62)  # the version (4) and variant (RFC 4122) bits of a random UUID
_NOT_UUID4 = ~((0xF << 76) | (0x3 << 62))


def new_id() -> str:
    """``uuid.uuid4().hex``: a random id (every rollout and group makes one), from ids made
    ``_ID_BATCH`` at a time out of one ``os.urandom`` -- asking the kernel for each costs more
    than the rest of the id. A forked child starts on a batch of its own."""
    try:
        return _ids.pop()  # (one step, so threads never take the same id)
    except IndexError:
        raw = os.urandom(16 * _ID_BATCH)
        _ids.extend(["%032x" % ((int.from_bytes(raw[i:i + 16], "big") & _NOT_UUID4) | _UUID4)
                     for i in range(0, len(raw), 16)])
        return _ids.pop()


_ID_BATCH = 256
_ids: list[str] = []
os.register_at_fork(after_in_child=_ids.clear)  # a child handing out its parent's ids would repeat them


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


M = TypeVar("M", bound=BaseModel)
_LAYOUTS: dict[type, tuple[dict[str, Any], tuple[tuple[str, Any], ...], bool]] = {}


def constructed(cls: type[M], **values: Any) -> M:
    """``cls.model_construct(**values)`` -- the same object, unvalidated -- for values known to
    be valid, at a fifth of its cost: capture builds a call on every LLM call, and pydantic's
    ``model_construct`` walks every field's default in Python each time."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        fields = cls.model_fields
        layout = _LAYOUTS[cls] = (
            {k: None if f.default_factory is not None else f.default for k, f in fields.items()},
            tuple((k, f.default_factory) for k, f in fields.items() if f.default_factory is not None),
            cls.model_config.get("extra") == "allow")
    defaults, factories, extra_allowed = layout
    if not values.keys() <= defaults.keys():
        return cls.model_construct(**values)  # extra fields: pydantic's own way of keeping them
    d = dict(defaults)  # the fields in their declared order, as model_construct leaves them
    for k, factory in factories:
        if k not in values:
            d[k] = factory()
    d.update(values)
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", d)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", {} if extra_allowed else None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def assigned(obj: BaseModel, **values: Any) -> None:
    """``obj.k = v`` for each value, as pydantic's assignment leaves the object (without
    validation, which these models do not ask for) at a fraction of its per-field cost: for the
    fields artsdk sets on every call of a rollout."""
    obj.__dict__.update(values)
    obj.__pydantic_fields_set__.update(values)


def check_messages(messages: Any, *, where: str = "messages") -> list[Message]:
    """Return ``messages`` as a list of chat dicts, or raise TrajectoryError naming the bad one.

    >>> check_messages([{"role": "user", "content": "hi"}])
    [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise TrajectoryError(
            f"{where} must be a list of chat messages like "
            f"[{{'role': 'user', 'content': '...'}}], got {type(messages).__name__}"
        )
    out: list[Message] = []
    for i, m in enumerate(messages):
        m = as_message(m)
        if not isinstance(m, dict):
            raise TrajectoryError(
                f"{where}[{i}] is a {type(m).__name__}, not a chat message dict "
                f"with 'role' and 'content'"
            )
        role = m.get("role")
        if role not in ROLES:
            raise TrajectoryError(
                f"{where}[{i}] has role {role!r}; expected one of {sorted(ROLES)}"
            )
        if role == "tool" and "tool_call_id" not in m:
            raise TrajectoryError(f"{where}[{i}] is a tool message without 'tool_call_id'")
        if "content" not in m and not m.get("tool_calls") and not m.get("function_call"):
            raise TrajectoryError(f"{where}[{i}] ({role}) has neither 'content' nor 'tool_calls'")
        out.append(m)
    return out


_NOTHING = (None, [], {})  # (made once: ``v not in (None, [], {})`` would make a list and a dict a field)


def as_message(m: Any) -> Any:
    """An OpenAI/LiteLLM message (a pydantic object, or a dict that may hold such objects, as
    ``{"role": "assistant", "tool_calls": msg.tool_calls}`` does) as plain JSON-like dicts and
    lists all the way down; the caller's objects are not changed."""
    if isinstance(m, dict):
        d = {k: v if type(v) is str else plain(v) for k, v in m.items()}
    else:
        dump = getattr(m, "model_dump", None)
        if dump is None:
            return m
        d = plain(dump(exclude_none=True))
        # openai objects carry empty optional lists/None fields that requests never had
        d = {k: v for k, v in d.items() if v not in _NOTHING or k == "content"}
    role = d.get("role")
    if isinstance(role, str) and type(role) is not str:  # a str enum (smolagents' MessageRole): its value
        d["role"] = str(getattr(role, "value", role))
    return d


class Choice(BaseModel):
    """One sampled answer to an LLM call. ``token_ids``/``logprobs`` are the exact sampled
    tokens and their log-probabilities when the server returned them (artsdk backends do)."""

    model_config = ConfigDict(extra="allow")

    index: int = 0
    message: Message
    finish_reason: Optional[str] = None
    token_ids: Optional[list[int]] = None
    logprobs: Optional[list[float]] = None

    @property
    def trainable(self) -> bool:
        """True when this choice carries the sampled token ids and logprobs needed for
        token-exact training."""
        return bool(self.token_ids) and self.logprobs is not None and len(self.logprobs) == len(
            self.token_ids
        )


class LLMCall(BaseModel):
    """One chat-completion call made inside a rollout: the request and every choice."""

    model_config = ConfigDict(extra="allow")

    index: int = 0
    provider: str = "openai"
    model: str = ""
    messages: list[Message] = Field(default_factory=list)
    tools: Optional[list[dict[str, Any]]] = None
    params: dict[str, Any] = Field(default_factory=dict)
    choices: list[Choice] = Field(default_factory=list)
    served_by: Optional[str] = None
    step: Optional[int] = None
    usage: Optional[dict[str, Any]] = None
    prompt_token_ids: Optional[list[int]] = None
    latency: float = 0.0
    stream: bool = False
    incomplete: bool = False
    error: Optional[str] = None

    @property
    def message(self) -> Optional[Message]:
        """The first choice's message (the one agent code usually continues with)."""
        return self.choices[0].message if self.choices else None


class ErrorInfo(BaseModel):
    """Why a rollout failed: the exception's type, message and traceback."""

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> "ErrorInfo":
        """The error, by its first cause when that is artsdk's CaptureError: a client that wraps
        what its transport raised (anthropic's and openai 2.x's ``APIConnectionError``) hides
        that strict capture refused the call."""
        import traceback

        shown, cause, seen = exc, exc.__cause__ or exc.__context__, 0
        while cause is not None and seen < 16:
            if isinstance(cause, CaptureError):
                shown = cause
                break
            cause, seen = cause.__cause__ or cause.__context__, seen + 1
        message = str(shown) if shown is exc else f"{shown} (the agent got {type(exc).__name__}: {exc})"
        return cls(
            type=type(shown).__name__,
            message=message,
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )


class Trajectory(BaseModel):
    """Everything one run of a rollout produced.

    ``outcome`` is what the decorated function returned; ``calls`` every LLM call it made;
    ``rewards`` the value of each reward function and ``reward`` their weighted sum;
    ``error`` is set when the agent code raised (the trajectory is still stored).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    id: str = Field(default_factory=new_id)
    rollout: str = ""
    project: Optional[str] = None
    model: Optional[str] = None
    run: Optional[str] = None  # the training run it was gathered in (set by art.session)
    step: Optional[int] = None
    group_id: Optional[str] = None
    group_index: Optional[int] = None
    attempt: int = 0
    scenario: Any = None
    outcome: Any = None
    calls: list[LLMCall] = Field(default_factory=list)
    rewards: dict[str, float] = Field(default_factory=dict)
    reward: Optional[float] = None
    error: Optional[ErrorInfo] = None
    warnings: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: Optional[datetime] = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the agent code finished without raising."""
        return self.error is None

    def scenario_as(self, cls: type[T], name: Optional[str] = None) -> T:
        """The rollout's argument ``name`` (or its only one) as a ``cls``, whether the trajectory
        is the one a gather just made (the live object it was called with) or one read from the
        store (its JSON: a dict). For rewards that run on both::

            def correct(t):
                review = t.scenario_as(Review)     # a dataclass, a pydantic model, an int...
                return float(t.outcome == review.label)
        """
        value: Any = self.scenario
        if isinstance(value, dict) and (name is not None or len(value) == 1):
            key = name if name is not None else next(iter(value))
            if key not in value:
                raise TrajectoryError(f"trajectory {self.id}: its scenario has no argument {name!r} "
                                      f"(it has {sorted(value)})")
            value = value[key]
        if isinstance(value, cls):
            return value
        validate = getattr(cls, "model_validate", None)
        if validate is not None:  # a pydantic model
            return validate(value)
        if isinstance(value, dict):  # a dataclass, or any class built from keyword arguments
            return cls(**value)  # type: ignore[call-arg]
        return cls(value)  # type: ignore[call-arg]

    @property
    def agent_calls(self) -> list[LLMCall]:
        """The calls the agent made: every call but a judge's (``params["judge"]``, added by
        ``art.Judge`` when it scored the trajectory)."""
        return [c for c in self.calls if not c.params.get("judge")]

    @property
    def messages(self) -> list[Message]:
        """The conversation as the agent last saw it: the last call's request messages
        followed by that call's first answer. Empty when no call was made."""
        calls = self.agent_calls
        if not calls:
            return []
        last = calls[-1]
        convo = last.messages
        if last.params.get("previous_response_id"):  # a Responses call continuing an earlier one
            from .response_items import whole_conversation

            try:
                convo = whole_conversation(self.calls, last)
            except TrajectoryError:
                pass  # its start is not recorded: what it sent is all there is
        return [*convo, *([last.message] if last.message is not None else [])]

    @property
    def last_message(self) -> Optional[Message]:
        """The last assistant message the model produced, or None."""
        for call in reversed(self.agent_calls):
            if call.message is not None:
                return call.message
        return None

    def choices(self) -> Iterator[tuple[LLMCall, Choice]]:
        """Every (call, choice) pair in call order."""
        for call in self.agent_calls:
            for choice in call.choices:
                yield call, choice


class Group(BaseModel):
    """Trajectories of the same scenario, compared with each other by GRPO.

    A group whose rewards are all equal carries no training signal: ``no_signal`` says so.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = Field(default_factory=new_id)
    trajectories: list[Trajectory] = Field(default_factory=list)
    rollout: str = ""
    scenario: Any = None

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        return iter(self.trajectories)

    def __getitem__(self, i: int) -> Trajectory:
        return self.trajectories[i]

    @property
    def scored(self) -> list[Trajectory]:
        """Trajectories that finished and have a reward (failed ones are excluded)."""
        return [t for t in self.trajectories if t.error is None and t.reward is not None]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.scored]  # type: ignore[misc]

    @property
    def errors(self) -> int:
        return sum(1 for t in self.trajectories if t.error is not None)

    @property
    def mean(self) -> float:
        r = self.rewards
        return sum(r) / len(r) if r else math.nan

    @property
    def std(self) -> float:
        r = self.rewards
        if not r:
            return math.nan
        m = sum(r) / len(r)
        return math.sqrt(sum((x - m) ** 2 for x in r) / len(r))

    @property
    def no_signal(self) -> bool:
        """True when fewer than two trajectories were scored or all rewards are equal:
        GRPO advantages would all be zero."""
        r = self.rewards
        return len(r) < 2 or max(r) - min(r) <= 1e-12
