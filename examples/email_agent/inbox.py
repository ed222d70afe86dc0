"""A generated inbox (seeded): a few thousand emails over several mailboxes in SQLite with
an FTS5 index, and questions whose answer is in one specific email."""

from __future__ import annotations

import json
import os
import random
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

MAILBOXES = ["ana", "ben", "chloe", "dev"]
FIRST = ["Maria", "Tom", "Priya", "Lucas", "Sofia", "Omar", "Yuki", "Elena", "Jonas", "Amara", "Felix",
         "Nina", "Raj", "Clara", "Diego", "Hana", "Ivan", "Leila", "Marco", "Zoe"]
LAST = ["Silva", "Becker", "Nguyen", "Okafor", "Rossi", "Kowalski", "Haddad", "Larsen", "Moreau", "Tanaka"]
VENDORS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark Supply", "Wonka"]
ITEMS = ["laptop", "standing desk", "monitor", "headset", "printer", "router", "office chair", "webcam",
         "keyboard", "projector"]
PLACES = ["Blue Cafe", "the Harbor Room", "Hotel Lumen", "the third-floor lab", "Green Park", "Cafe Roma",
          "the main lobby", "Studio 9"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Nairobi", "Toronto", "Seoul", "Lima", "Prague"]
TOPICS = ["quarterly budget", "design review", "hiring plan", "onboarding", "security audit", "roadmap",
          "customer feedback", "release notes", "team offsite", "data migration"]
MONTHS = ["March", "April", "May", "June"]


@dataclass
class Question:
    id: int
    mailbox: str
    question: str
    answer: str
    source: int  # the id of the email that holds the answer


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _addr(name: str) -> str:
    return name.lower().replace(" ", ".") + "@mail.example"


def _date(rng: random.Random) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"


def _filler(rng: random.Random, mailbox: str) -> tuple[str, str, str]:
    who, topic = _person(rng), rng.choice(TOPICS)
    kind = rng.randrange(4)
    if kind == 0:
        return who, f"Re: {topic}", (f"Hi {mailbox.title()},\n\nThanks for the notes on the {topic}. I will "
                                      f"send an update by {_date(rng)}.\n\nBest,\n{who}")
    if kind == 1:
        return "newsletter@news.example", f"Weekly digest: {topic}", (
            f"This week: ten ideas about {topic}, an interview with {who}, and events in "
            f"{rng.choice(CITIES)}.")
    if kind == 2:
        return who, f"{topic.title()} follow-up", (f"Can we move the {topic} discussion? {_date(rng)} "
                                                    f"works better for me.\n{who}")
    return who, "Quick question", f"Did you get a chance to look at the {topic} doc? - {who}"


def _fact(rng: random.Random, mailbox: str) -> tuple[str, str, str, str, str, str]:
    """(key, sender, subject, body, question, answer) of an email holding one fact; the key
    names what the question asks about, so no two questions share an answer."""
    kind = rng.randrange(4)
    if kind == 0:
        vendor, item, number = rng.choice(VENDORS), rng.choice(ITEMS), str(rng.randint(10000, 99999))
        return (f"order:{mailbox}:{vendor}:{item}", f"orders@{vendor.lower().replace(' ', '')}.example",
                f"Order confirmation #{number}",
                f"Thank you for your order. Your {item} (order #{number}) from {vendor} will arrive on "
                f"{_date(rng)}.", f"What is the order number of the {item} ordered from {vendor}?", number)
    if kind == 1:
        who, date, place = _person(rng), _date(rng), rng.choice(PLACES)
        return (f"meet:{mailbox}:{who}", _addr(who), f"Meeting on {date}",
                f"Hi {mailbox.title()}, let's meet at {place} on {date} at {rng.randint(9, 17)}:00. "
                f"Cheers, {who}", f"Where is the meeting with {who}?", place)
    if kind == 2:
        inv, amount = f"INV-{rng.randint(1000, 9999)}", f"${rng.randint(100, 9999)}.{rng.randint(0, 99):02d}"
        return (f"inv:{inv}", f"billing@{rng.choice(VENDORS).lower().replace(' ', '')}.example",
                f"Invoice {inv}", f"Invoice {inv} for {amount} is due on {_date(rng)}. Please pay by "
                f"bank transfer.", f"How much is invoice {inv}?", amount)
    city, code = rng.choice(CITIES), f"{rng.choice(['LX', 'AF', 'KL', 'NH'])}{rng.randint(100, 999)}"
    return (f"flight:{mailbox}:{city}", "travel@booking.example", f"Your trip to {city}",
            f"Booking confirmed: flight {code} to {city} departs {_date(rng)} at {rng.randint(6, 22)}:15.",
            f"What is the flight number of the trip to {city}?", code)


def build(path: Path, *, seed: int = 0, per_mailbox: int = 750, facts_per_mailbox: int = 60) -> Path:
    """Write the inbox database (once: it is reused when the file exists)."""
    if path.is_file():
        return path
    rng = random.Random(seed)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(tmp)
    db.executescript("""
        CREATE TABLE emails (id INTEGER PRIMARY KEY, mailbox TEXT, sender TEXT, recipient TEXT,
                             subject TEXT, body TEXT, date TEXT);
        CREATE VIRTUAL TABLE emails_fts USING fts5(subject, body, sender, content='emails', content_rowid='id');
        CREATE TABLE questions (id INTEGER PRIMARY KEY, data TEXT);
    """)
    used: set[str] = set()
    questions: list[Question] = []
    rows = []
    for mailbox in MAILBOXES:
        facts = 0
        for _ in range(per_mailbox):
            fact = _fact(rng, mailbox) if facts < facts_per_mailbox and rng.random() < 0.15 else None
            if fact is not None and fact[0] not in used:
                used.add(fact[0])
                _, sender, subject, body, q, a = fact
                facts += 1
            else:
                sender, subject, body = _filler(rng, mailbox)
                q = a = None
            rows.append((len(rows) + 1, mailbox, sender if "@" in sender else _addr(sender),
                         f"{mailbox}@mail.example", subject, body, _date(rng)))
            if q is not None:
                questions.append(Question(len(questions), mailbox, q, a, len(rows)))
    db.executemany("INSERT INTO emails VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    db.execute("INSERT INTO emails_fts(rowid, subject, body, sender) SELECT id, subject, body, sender FROM emails")
    db.executemany("INSERT INTO questions VALUES (?, ?)", [(q.id, json.dumps(asdict(q))) for q in questions])
    db.commit()
    db.close()
    try:
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
    return path


class Inbox:
    """Read-only access to the inbox database, as the agent's tools see it."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)

    def questions(self) -> list[Question]:
        return [Question(**json.loads(d)) for (d,) in self.db.execute("SELECT data FROM questions ORDER BY id")]

    def search(self, keywords: Any, mailbox: Optional[str] = None, limit: int = 5) -> list[dict[str, Any]]:
        words = keywords.split() if isinstance(keywords, str) else [str(k) for k in keywords or []]
        terms = [w.replace('"', "") for w in words if w.strip('"')]
        if not terms:
            return []
        query = " ".join(f'"{t}"' for t in terms)
        sql = ("SELECT e.id, e.date, e.sender, e.subject, snippet(emails_fts, 1, '', '', '...', 12) "
               "FROM emails_fts JOIN emails e ON e.id = emails_fts.rowid WHERE emails_fts MATCH ?")
        args: list[Any] = [query]
        if mailbox:
            sql += " AND e.mailbox = ?"
            args.append(mailbox)
        sql += " ORDER BY rank LIMIT ?"
        args.append(max(1, min(int(limit), 10)))
        return [{"id": r[0], "date": r[1], "from": r[2], "subject": r[3], "snippet": r[4]}
                for r in self.db.execute(sql, args)]

    def read(self, email_id: Any) -> Optional[dict[str, Any]]:
        r = self.db.execute("SELECT id, date, sender, recipient, subject, body FROM emails WHERE id = ?",
                            (int(email_id),)).fetchone()
        if r is None:
            return None
        return {"id": r[0], "date": r[1], "from": r[2], "to": r[3], "subject": r[4], "body": r[5]}

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM emails").fetchone()[0]
