"""``art.Judge``: a reward for when no rule can score the outcome -- a judge model scores a
group's trajectories against a task description, relative to each other.

```python
judge = art.Judge("Answer the question from the emails, citing the ones used.", model="gpt-4o-mini")
groups = await art.gather(research, questions, group_size=8, rewards=[judge])
```

The judge is any OpenAI-compatible endpoint: a hosted model (the client reads
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, or give ``base_url`` / ``api_key`` / ``client``), an
``artsdk serve``, or inside a session the trainable model itself by its name. Its answer must
be JSON, one score from 0 to 1 per candidate; a malformed answer is asked again (``retries``),
and a judge that keeps failing raises a RewardError saying what was wrong. Answers are cached
by content (the task, the model, the candidates), and each trajectory keeps the judge's call
among its calls, marked ``params["judge"]``, which is never trained.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from time import perf_counter
from typing import Any, Optional, Sequence

from ..errors import RewardError
from .functions import Reward
from ..trajectory.records import LLMCall, Trajectory

INSTRUCTIONS = (
    "You judge candidate attempts at a task. Compare them with each other and score each from 0 (worst) "
    "to 1 (best): better work gets a higher score. Answer with JSON only, no other text: "
    '{"scores": [{"candidate": 1, "score": 0.5, "reason": "..."}, ...]}, one entry per candidate, in order.')


class Judge(Reward):
    """A group reward scored by a judge model (see the module docs)."""

    def __init__(self, task: str, model: str, *, client: Any = None, base_url: Optional[str] = None,
                 api_key: Optional[str] = None, name: str = "judge", weight: float = 1.0, retries: int = 2,
                 max_chars: int = 3000, temperature: float = 0.0, cache_size: int = 10_000) -> None:
        if not isinstance(task, str) or not task.strip():
            raise RewardError("Judge needs the task as text: what a good attempt does")
        super().__init__(self._score, name=name, weight=weight, group=True)
        self.task, self.model = task.strip(), model
        self._client, self._base_url, self._api_key = client, base_url, api_key
        self.retries, self.max_chars, self.temperature = retries, max_chars, temperature
        self._cache: "OrderedDict[str, tuple[list[float], LLMCall]]" = OrderedDict()
        self._cache_size = cache_size
        self.calls_made = 0  # answers asked of the judge (not counting the cache's)

    def __repr__(self) -> str:
        return f"<judge {self.name!r} model={self.model!r} weight={self.weight}>"

    def client(self) -> Any:
        if self._client is None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(base_url=self._base_url, api_key=self._api_key or "unused")
        return self._client

    async def _score(self, trajectories: Sequence[Trajectory]) -> list[float]:
        shown = [self.render(t) for t in trajectories]
        key = hashlib.sha256(json.dumps([self.task, self.model, shown]).encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            scores, call = self._cache[key]
        else:
            scores, call = await self._ask(shown)
            self._cache[key] = (scores, call)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        for t in trajectories:  # the judge's call beside the agent's: recorded, never trained
            t.calls.append(call.model_copy(update={"index": len(t.calls)}, deep=True))
        return scores

    def render(self, t: Trajectory) -> str:
        """One candidate as the judge reads it: the conversation and the outcome (cut to
        ``max_chars``)."""
        lines = []
        for m in t.messages:
            text = m.get("content")
            text = text if isinstance(text, str) else json.dumps(text) if text is not None else ""
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                text += f" [calls {fn.get('name')}({fn.get('arguments')})]"
            lines.append(f"{m.get('role')}: {text}")
        lines.append(f"outcome: {json.dumps(t.outcome, default=repr)}")
        if t.error is not None:
            lines.append(f"failed: {t.error.type}: {t.error.message}")
        text = "\n".join(lines)
        return text if len(text) <= self.max_chars else text[: self.max_chars // 2] + "\n[...]\n" + \
            text[-self.max_chars // 2:]

    async def _ask(self, shown: list[str]) -> tuple[list[float], LLMCall]:
        from ..capture.record import from_response

        body = "\n\n".join(f"Candidate {i + 1}:\n{s}" for i, s in enumerate(shown))
        messages = [{"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": f"Task: {self.task}\n\n{body}\n\nScore the {len(shown)} candidates."}]
        problem = ""
        for attempt in range(self.retries + 1):
            kwargs = {"model": self.model, "messages": messages, "temperature": self.temperature}
            t0 = perf_counter()
            try:
                resp = await self.client().chat.completions.create(**kwargs)
            except Exception as e:  # noqa: BLE001 - said with the judge's name
                raise RewardError(f"judge {self.name!r} ({self.model}) could not be asked: {type(e).__name__}: {e}") \
                    from e
            self.calls_made += 1
            call = from_response("judge", kwargs, resp, perf_counter() - t0)
            call.params["judge"] = self.name
            answer = resp.choices[0].message.content or ""
            scores, problem = parse_scores(answer, len(shown))
            if scores is not None:
                return scores, call
            messages = [*messages, {"role": "assistant", "content": answer},
                        {"role": "user", "content": f"That answer is not valid: {problem}. Answer again with JSON "
                                                    f"only, one score from 0 to 1 for each of the {len(shown)} "
                                                    f"candidates."}]
        raise RewardError(f"judge {self.name!r} ({self.model}) gave no valid answer in {self.retries + 1} tries; the "
                          f"last: {problem}")


def parse_scores(answer: str, n: int) -> tuple[Optional[list[float]], str]:
    """(the n scores, "") from a judge's answer, or (None, what is wrong with it)."""
    found = re.search(r"\{.*\}", answer, re.S)
    if found is None:
        return None, f"no JSON object in {answer[:80]!r}"
    try:
        data = json.loads(found.group())
    except ValueError as e:
        return None, f"the JSON does not parse ({e})"
    items = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(items, list) or len(items) != n:
        return None, f'"scores" must be a list of {n} entries, got {str(items)[:80]}'
    out = []
    for i, item in enumerate(items):
        score = item.get("score") if isinstance(item, dict) else item
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
            return None, f"candidate {i + 1}'s score {score!r} is not a number from 0 to 1"
        out.append(float(score))
    return out, ""
