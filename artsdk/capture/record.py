"""Turning a chat-completion request and its response (or stream of chunks) into an
``LLMCall``. OpenAI and LiteLLM objects have the same attribute shape, so one reader serves
both patchers.

Responses are read attribute by attribute instead of through ``model_dump()``: capture runs
on every call and dumping a whole response costs several times more.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Iterable, Optional

from ..trajectory.records import Choice, LLMCall, as_message, constructed
from ..trajectory.response_items import plain
from .prefix import reused

# Request keys that are not sampling parameters (or cannot be stored as JSON).
_NOT_PARAMS = frozenset(
    {"messages", "model", "tools", "stream", "extra_headers", "extra_query", "timeout",
     "api_key", "api_base", "base_url", "client", "metadata", "http_client"}
)
_LOGPROB, _TOKEN = attrgetter("logprob"), attrgetter("token")
CUT = "the stream ended before its finish reason: the connection was cut"


def request_parts(kwargs: dict[str, Any]) -> tuple[str, list[dict[str, Any]], Any, dict[str, Any]]:
    """(model, messages, tools, params) of a create() call, copied so the agent appending
    to its message list later does not rewrite history."""
    messages = copied(kwargs.get("messages") or ())
    tools = kwargs.get("tools")
    if tools is not None and not given(tools):
        tools = None
    if tools is not None:
        tools = [as_message(t) for t in tools]
    params = {}
    for k, v in kwargs.items():
        if k in _NOT_PARAMS or not given(v):
            continue
        if isinstance(v, type):  # response_format=SomeModel in .parse(): the JSON schema that was sent
            v = response_format_sent(v)
        params[k] = plain(v)  # (a copy: the agent may change its stop list or extra_body for the next call)
    return str(kwargs.get("model", "")), messages, tools, params


def copied(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as plain dicts (``as_message``), reusing the copies the rollout's last call
    made of those it sent too and that still say the same (prefix.py): recording a call costs
    about the same at the 20th turn as at the first, and a message changed in place
    (``msg["content"] = "[cut]"``) is copied anew."""
    return reused("chat", messages, as_message)


def response_format_sent(cls: type) -> Any:
    """What the openai client sends for ``response_format=cls`` (``.parse()``): its JSON schema,
    as the API receives it."""
    try:
        from openai.lib._parsing._completions import type_to_response_format_param

        return type_to_response_format_param(cls)
    except Exception:  # noqa: BLE001 - not the openai client's kind of type: its schema if it has one
        schema = getattr(cls, "model_json_schema", None)
        return {"type": "json_schema", "json_schema": {"name": cls.__name__, "schema": schema()}} if schema else \
            f"{cls.__module__}.{cls.__qualname__}"


def given(v: Any) -> bool:
    """False for the clients' Omit / NotGiven sentinels (openai's and anthropic's): "argument not passed"."""
    return type(v).__name__ not in ("Omit", "NotGiven")


def extra_field(obj: Any, key: str) -> Any:
    """A field a server added to a response object (artsdk's backends add token ids)."""
    if isinstance(obj, dict):
        return obj.get(key)
    extra = getattr(obj, "__pydantic_extra__", None)
    if extra is not None:  # a pydantic object: asking it for a missing attribute costs an exception
        return extra[key] if key in extra else obj.__dict__.get(key)  # (a field a newer client declares)
    return getattr(obj, key, None)  # litellm's objects keep extra fields as attributes


def served_step(served_by: Optional[str]) -> Optional[int]:
    """``"agent@3"`` -> 3: artsdk backends name the adapter step that answered."""
    if served_by:
        _, at, step = served_by.rpartition("@")
        if at and step.isdigit() and step.isascii():
            return int(step)
    return None


def _tool_calls(tool_calls: Any) -> Optional[list[dict[str, Any]]]:
    if not tool_calls:
        return None
    out = []
    for tc in tool_calls:
        if isinstance(tc, dict):
            out.append(tc)
            continue
        fn = tc.function
        out.append(
            {"id": tc.id, "type": getattr(tc, "type", None) or "function",
             "function": {"name": fn.name, "arguments": fn.arguments}}
        )
    return out


def _logprobs_content(choice: Any) -> Any:
    """The per-token entries of a choice's logprobs (None when it has none)."""
    lp = getattr(choice, "logprobs", None)
    content = getattr(lp, "content", None) if lp is not None else None
    if content is None and isinstance(lp, dict):
        content = lp.get("content")
    return content or None


def _logprobs(content: Any) -> list[float]:
    if isinstance(content[0], dict):
        return [c["logprob"] for c in content]
    return list(map(_LOGPROB, content))  # at C speed: once per chunk streamed


def _tokens(content: Any) -> list[str]:
    """The tokens' texts: read only where the ids are not sent beside them (they are in them)."""
    if isinstance(content[0], dict):
        return [c.get("token", "") for c in content]
    return list(map(_TOKEN, content))


def _token_ids(choice: Any, content: Any) -> Optional[list[int]]:
    ids = extra_field(choice, "token_ids")
    if ids is not None:
        return list(ids)
    return _ids_in_tokens(_tokens(content)) if content else None


def _ids_in_tokens(tokens: Optional[list[str]]) -> Optional[list[int]]:
    """vLLM's --return-tokens-as-token-ids spells each token "token:123"."""
    if tokens and tokens[0].startswith("token:"):
        try:
            return [int(t[6:]) for t in tokens]
        except ValueError:
            return None
    return None


def _usage(resp: Any) -> Optional[dict[str, Any]]:
    u = getattr(resp, "usage", None)
    if u is None:
        return None
    if isinstance(u, dict):
        return u
    return {
        "prompt_tokens": getattr(u, "prompt_tokens", None),
        "completion_tokens": getattr(u, "completion_tokens", None),
        "total_tokens": getattr(u, "total_tokens", None),
    }


def from_response(
    provider: str, kwargs: dict[str, Any], resp: Any, latency: float,
    request: Optional[tuple[str, list[dict[str, Any]], Any, dict[str, Any]]] = None,
) -> LLMCall:
    """An LLMCall from a complete (non-streamed) chat completion."""
    model, messages, tools, params = request or request_parts(kwargs)
    choices = []
    for c in resp.choices:
        m = c.message
        msg: dict[str, Any] = {"role": getattr(m, "role", None) or "assistant",
                               "content": getattr(m, "content", None)}
        tcs = _tool_calls(getattr(m, "tool_calls", None))
        if tcs:
            msg["tool_calls"] = tcs
        refusal = getattr(m, "refusal", None)
        if refusal:
            msg["refusal"] = refusal
        content = _logprobs_content(c)
        # unvalidated: the message is the plain dict made above, the rest read from the client's types
        choices.append(constructed(Choice, index=c.index or 0, message=msg, finish_reason=c.finish_reason,
                                   token_ids=_token_ids(c, content),
                                   logprobs=_logprobs(content) if content else None))
    served_by = getattr(resp, "model", None)
    # built without validating the messages again: they are the plain dicts ``copied`` made, and
    # validating them would copy every message of the conversation on every call
    return constructed(
        LLMCall, provider=provider, model=model, messages=messages, tools=tools, params=params,
        choices=choices, served_by=served_by, step=served_step(served_by),
        usage=_usage(resp), latency=latency,
        prompt_token_ids=extra_field(resp, "prompt_token_ids"),
    )


class StreamAccumulator:
    """Assembles streamed chunks into choices, the way the final message would have
    looked had the call not been streamed."""

    def __init__(self, provider: str, kwargs: dict[str, Any], request: Optional[tuple[Any, ...]] = None) -> None:
        self.provider = provider
        self.request = request or request_parts(kwargs)  # (the request as sent, read before it went out)
        self.choices: dict[int, dict[str, Any]] = {}
        self.served_by: Optional[str] = None
        self.usage: Optional[dict[str, Any]] = None
        self.prompt_token_ids: Optional[list[int]] = None
        self.done = False

    def add(self, chunk: Any) -> None:
        # runs on every chunk: what most chunks carry (a delta's content, a token's logprob and
        # id) is read inline, without a helper call per field
        if self.served_by is None:
            # litellm streams rename chunk.model to the requested model; the server's
            # answer (name@step) is kept in its hidden params
            hidden = getattr(chunk, "_hidden_params", None) or {}
            self.served_by = hidden.get("provider_response_model") or getattr(chunk, "model", None)
        if getattr(chunk, "usage", None) is not None:
            self.usage = _usage(chunk)
        if self.prompt_token_ids is None:
            extra = getattr(chunk, "__pydantic_extra__", None)  # as extra_field reads it, inline
            if extra is None or "prompt_token_ids" in extra or "prompt_token_ids" in chunk.__dict__:
                self.prompt_token_ids = extra_field(chunk, "prompt_token_ids") or None
        for c in chunk.choices or ():
            i = c.index or 0
            st = self.choices.get(i)
            if st is None:
                st = self.choices[i] = {
                    "role": "assistant", "content": [], "tool_calls": {}, "finish_reason": None,
                    "logprobs": [], "tokens": [], "token_ids": [],
                }
            d = c.delta
            if d is not None:
                if getattr(d, "role", None):
                    st["role"] = d.role
                content = getattr(d, "content", None)
                if content:
                    st["content"].append(content)
                tool_calls = getattr(d, "tool_calls", None)
                if tool_calls:
                    self._add_tool_calls(st["tool_calls"], tool_calls)
            if c.finish_reason:
                st["finish_reason"] = c.finish_reason
            extra = getattr(c, "__pydantic_extra__", None)  # as extra_field reads it, inline
            if extra is not None:
                ids = extra["token_ids"] if "token_ids" in extra else c.__dict__.get("token_ids")
            else:
                ids = extra_field(c, "token_ids")
            if ids:
                st["token_ids"].extend(ids)
            lp = getattr(c, "logprobs", None)
            if lp is not None:
                content = getattr(lp, "content", None) if not isinstance(lp, dict) else lp.get("content")
                if content:
                    st["logprobs"].extend(map(_LOGPROB, content) if not isinstance(content[0], dict)
                                          else _logprobs(content))
                    if not ids:  # the ids are in the tokens' texts (vLLM's "token:123")
                        st["tokens"].extend(_tokens(content))

    @staticmethod
    def _add_tool_calls(slots: dict[int, dict[str, Any]], tool_calls: Any) -> None:
        for tc in tool_calls:
            slot = slots.setdefault(tc.index or 0, {"id": None, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
            if tc.id:
                slot["id"] = tc.id
            fn = tc.function
            if fn is not None:
                if fn.name:
                    slot["function"]["name"] += fn.name
                if fn.arguments:
                    slot["function"]["arguments"] += fn.arguments

    @property
    def finished(self) -> bool:
        """Every choice has its finish reason: the stream ended, whoever closed it."""
        return bool(self.choices) and all(c["finish_reason"] for c in self.choices.values())

    def to_call(self, latency: float, left_early: bool, failure: Optional[str] = None) -> LLMCall:
        """The call as assembled so far. ``left_early``: the agent (or the rollout's end)
        closed the stream before it ended; otherwise it ran out, and running out before
        every choice had its finish reason means the connection was cut. ``failure``: the
        error reading it raised."""
        model, messages, tools, params = self.request
        incomplete = not self.finished
        error = failure if incomplete and failure else (CUT if incomplete and not left_early else None)
        choices = []
        for i in sorted(self.choices):
            st = self.choices[i]
            msg: dict[str, Any] = {"role": st["role"], "content": "".join(st["content"]) or None}
            if st["tool_calls"]:
                msg["tool_calls"] = [st["tool_calls"][k] for k in sorted(st["tool_calls"])]
            ids = st["token_ids"] or _ids_in_tokens(st["tokens"])
            choices.append(constructed(Choice, index=i, message=msg, finish_reason=st["finish_reason"],
                                       token_ids=ids or None, logprobs=st["logprobs"] or None))
        # built without validating the messages again, as ``from_response`` builds a call: a
        # streamed turn 20 costs what turn 1 does
        return constructed(
            LLMCall, provider=self.provider, model=model, messages=messages, tools=tools, params=params,
            choices=choices, served_by=self.served_by, step=served_step(self.served_by),
            usage=self.usage, prompt_token_ids=self.prompt_token_ids, latency=latency,
            stream=True, incomplete=incomplete, error=error,
        )


def failed_call(provider: str, kwargs: dict[str, Any], exc: BaseException, latency: float,
                request: Optional[tuple[str, list[dict[str, Any]], Any, dict[str, Any]]] = None) -> LLMCall:
    """A call that raised (HTTP error, timeout): recorded so the trajectory shows it."""
    model, messages, tools, params = request or request_parts(kwargs)
    return LLMCall(provider=provider, model=model, messages=messages, tools=tools, params=params,
                   latency=latency, error=f"{type(exc).__name__}: {exc}")


def chunks_from_call(call: LLMCall) -> Iterable[dict[str, Any]]:
    """Chunks (as dicts) that replay a recorded call as a stream: one carrying each choice's
    whole message, then one with its finish reason."""
    for c in call.choices:
        delta: dict[str, Any] = {"role": "assistant", "content": c.message.get("content")}
        if c.message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": j, **tc} for j, tc in enumerate(c.message["tool_calls"])
            ]
        yield {"id": "replay", "object": "chat.completion.chunk", "created": 0,
               "model": call.served_by or call.model,
               "choices": [{"index": c.index, "delta": delta, "finish_reason": None}]}
        yield {"id": "replay", "object": "chat.completion.chunk", "created": 0,
               "model": call.served_by or call.model,
               "choices": [{"index": c.index, "delta": {}, "finish_reason": c.finish_reason or "stop"}]}


def response_from_call(call: LLMCall) -> dict[str, Any]:
    """A recorded call as a chat-completion response dict."""
    return {
        "id": "replay", "object": "chat.completion", "created": 0,
        "model": call.served_by or call.model,
        "choices": [
            {"index": c.index, "message": c.message, "finish_reason": c.finish_reason or "stop"}
            for c in call.choices
        ],
        "usage": call.usage,
    }
