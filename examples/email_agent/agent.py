"""The email research agent: it searches an inbox with keyword tools, reads emails, and
answers with the sources it used."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from openai import AsyncOpenAI

import artsdk as art

from .inbox import Inbox, Question, build

client = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")  # routed by art.session
MODEL = "email-agent"
MAX_TURNS = 6
IDK = ("i don't know", "i do not know", "unknown", "not found")

TOOLS = [
    {"type": "function", "function": {
        "name": "search_emails", "description": "Full-text search of the inbox; returns ids, subjects, snippets.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "array", "items": {"type": "string"}, "description": "words that must all appear"},
            "limit": {"type": "integer", "description": "at most this many results (up to 10)"}},
            "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "read_email", "description": "The whole email with this id.",
        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer and the ids of the emails it comes from.",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string"}, "sources": {"type": "array", "items": {"type": "integer"}}},
            "required": ["text", "sources"]}}},
]


@lru_cache(maxsize=1)
def inbox() -> Inbox:
    cache = Path(os.environ.get("ARTSDK_CACHE") or Path.home() / ".cache" / "artsdk")
    return Inbox(build(cache / "email_agent" / "inbox-seed0.db"))


def questions() -> list[Question]:
    return inbox().questions()


def run_tool(name: str, args: dict[str, Any], mailbox: str, seen: dict[str, set[int]]) -> Any:
    if name == "search_emails":
        hits = inbox().search(args.get("keywords", []), mailbox=mailbox, limit=args.get("limit", 5))
        seen["found"].update(h["id"] for h in hits)
        return hits or "no emails match all of these keywords"
    if name == "read_email":
        email = inbox().read(args.get("id", -1))
        if email is None:
            return f"there is no email with id {args.get('id')}"
        seen["read"].add(email["id"])
        return email
    return f"unknown tool {name!r}"


def system_prompt(q: Question) -> str:
    return (f"You answer questions about the inbox of {q.mailbox}. Search it with search_emails, read "
            "emails with read_email, and finish with answer(text, sources). If you cannot find it, "
            "answer \"I don't know\".")


@art.rollout(name="email-research")
async def research(q: Question, temperature: float = 1.0) -> dict:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(q)},
                                      {"role": "user", "content": q.question}]
    seen: dict[str, set[int]] = {"found": set(), "read": set(), "calls": set()}
    for turn in range(1, MAX_TURNS + 1):
        resp = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                                    max_tokens=96, temperature=temperature)
        msg = resp.choices[0].message
        if not msg.tool_calls:  # a plain answer: taken as final, without sources
            return _outcome(msg.content, [], turn, seen)
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            try:
                args = json.loads(call.function.arguments or "{}")
                if not isinstance(args, dict):
                    raise ValueError("arguments must be an object")
            except ValueError as e:  # a malformed call is part of the episode: the model sees why
                result: Any = f"invalid arguments: {e}"
            else:
                seen["calls"].add(call.id)
                if call.function.name == "answer":
                    sources = [s for s in args.get("sources", []) if isinstance(s, int)]
                    return _outcome(str(args.get("text", "")), sources, turn, seen)
                result = run_tool(call.function.name, args, q.mailbox, seen)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)[:2000]})
    return _outcome(None, [], MAX_TURNS, seen)


def _outcome(text: Optional[str], sources: list[int], turns: int, seen: dict[str, set[int]]) -> dict:
    return {"answer": text, "sources": sources, "turns": turns, "tool_calls": len(seen["calls"]),
            "found": sorted(seen["found"]), "read": sorted(seen["read"])}


def is_correct(answer: Optional[str], expected: str) -> bool:
    """The rule where the answer is exact: the expected value appears in the answer."""
    return bool(answer) and expected.lower() in answer.lower()


def said_idk(answer: Optional[str]) -> bool:
    return not answer or any(p in answer.lower() for p in IDK)


def _question(traj: art.Trajectory) -> Question:
    q = traj.scenario["q"]
    return q if isinstance(q, Question) else Question(**q)


@art.reward
def correct(traj: art.Trajectory) -> float:
    """1 for the right answer with the right source, 0.7 without it; 0 for "I don't know";
    -0.5 for a wrong answer (worse than admitting it)."""
    q, o = _question(traj), traj.outcome
    if is_correct(o["answer"], q.answer):
        return 1.0 if q.source in o["sources"] else 0.7
    return 0.0 if said_idk(o["answer"]) else -0.5


@art.reward
def progress(traj: art.Trajectory) -> float:
    """Partial credit for finding (0.1) and reading (0.1) the email that holds the answer."""
    q, o = _question(traj), traj.outcome
    return 0.1 * (q.source in o["found"]) + 0.1 * (q.source in o["read"])


@art.reward
def tool_use(traj: art.Trajectory) -> float:
    """0.1 for making at least one well-formed tool call: the first thing a small model learns."""
    return 0.1 if traj.outcome.get("tool_calls", 0) > 0 else 0.0


@art.reward
def turns(traj: art.Trajectory) -> float:
    """-0.02 for each turn past the third."""
    return -0.02 * max(0, traj.outcome["turns"] - 3)


JUDGE_TASK = ("Answer a question about an inbox with the fact from the email that holds it, citing that "
              "email's id. An answer is only as good as the emails the agent found and read: one not backed "
              "by an email in the conversation is worse than \"I don't know\".")


def judged(judge_model: str, base_url: Optional[str] = None, api_key: Optional[str] = None) -> art.Judge:
    """A judge model scoring a group's research relative to each other (for answers the exact
    rule cannot score: "the meeting is at Blue Cafe, 3pm" for "Blue Cafe"). Without ``base_url``
    it asks where the OpenAI client points (``OPENAI_BASE_URL``); in a session, the trainable
    model's own name asks the model being trained."""
    return art.Judge(JUDGE_TASK, model=judge_model, base_url=base_url, api_key=api_key, weight=0.5)


REWARDS = [correct, progress, tool_use, turns]
