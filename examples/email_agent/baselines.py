"""Researchers to judge the trained model against, on the same questions and rewards: one that
always says "I don't know" (what a cautious model scores), and a scripted one that knows the
four kinds of question -- it searches with the words that name the fact, reads the top hit and
copies the answer out of it (the ceiling a rule reaches).

The scripted researcher's conversations, with the reference answer, are the warm-up's good
examples: exactly the messages the agent would have sent and received, had it done the same.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

from .agent import TOOLS, run_tool, system_prompt
from .inbox import Question

# the words to search with, by kind of question (the question's own words, as the model can copy them)
_ASKS = [
    (re.compile(r"invoice (\S+)\?$"), lambda m: [m.group(1)]),
    (re.compile(r"meeting with (.+)\?$"), lambda m: [m.group(1), "meet"]),
    (re.compile(r"order number of the (.+) ordered from (.+)\?$"), lambda m: [m.group(2), m.group(1)]),
    (re.compile(r"flight number of the trip to (.+)\?$"), lambda m: ["flight", m.group(1)]),
]
# where the answer sits in the email that holds it
_ANSWERS = [re.compile(p) for p in (r"for (\$[\d.]+) is due", r"meet at (.+?) on ", r"\(order #(\d+)\)",
                                    r"flight (\w+) to ")]


def keywords(question: str) -> list[str]:
    for pattern, words in _ASKS:
        m = pattern.search(question)
        if m:
            return words(m)
    return question.rstrip("?").split()[-2:]


def _extract(body: str) -> Optional[str]:
    return next((m.group(1) for p in _ANSWERS if (m := p.search(body))), None)


def research(q: Question, *, reference: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the outcome, the conversation) of the scripted researcher: search, read the top hit,
    answer what the email says (or, with ``reference``, the question's reference answer and
    source: a conversation worth learning from)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(q)},
                                      {"role": "user", "content": q.question}]
    seen: dict[str, set[int]] = {"found": set(), "read": set(), "calls": set()}

    def call(n: int, name: str, args: dict[str, Any]) -> Any:
        call_id = f"call_{n}"
        messages.append({"role": "assistant", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        seen["calls"].add(call_id)
        if name == "answer":
            return None
        result = run_tool(name, args, q.mailbox, seen)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)[:2000]})
        return result

    hits = call(1, "search_emails", {"keywords": keywords(q.question)})
    top = hits[0]["id"] if isinstance(hits, list) and hits else None
    email = call(2, "read_email", {"id": q.source if reference else top}) if (reference or top) else None
    if reference:
        text, sources = q.answer, [q.source]
    else:
        found = _extract(email["body"]) if isinstance(email, dict) else None
        text, sources = (found, [email["id"]]) if found else ("I don't know", [])
    call(3, "answer", {"text": text, "sources": sources})
    outcome = {"answer": text, "sources": sources, "turns": 3, "tool_calls": len(seen["calls"]),
               "found": sorted(seen["found"]), "read": sorted(seen["read"])}
    return outcome, messages


def dont_know(q: Question) -> dict[str, Any]:
    return {"answer": "I don't know", "sources": [], "turns": 1, "tool_calls": 0, "found": [], "read": []}


def scripted(q: Question) -> dict[str, Any]:
    return research(q)[0]


def warmup_conversations(qs: list[Question]) -> list[dict[str, Any]]:
    """Good conversations to warm up on: the scripted researcher's, with the reference answers."""
    return [{"messages": research(q, reference=True)[1], "tools": TOOLS} for q in qs]


BASELINES: dict[str, Callable[[Question], dict[str, Any]]] = {
    "always \"I don't know\"": dont_know, "search, read the top hit, copy (scripted)": scripted}
