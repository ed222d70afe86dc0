"""Labellers to judge the trained model against, on the same reviews and reward: one that
always answers "positive", and a scripted one that counts the review's words from the
generator's lists of good and bad words (the ceiling a rule reaches)."""

from __future__ import annotations

import re

from .reviews import BAD, GOOD, Review


def always_positive(review: Review) -> str:
    return "positive"


def word_lists(review: Review) -> str:
    words = re.findall(r"[a-z]+", review.text.lower())
    good, bad = sum(w in GOOD for w in words), sum(w in BAD for w in words)
    return "positive" if good >= bad else "negative"


BASELINES = {"always \"positive\"": always_positive, "good and bad word lists (scripted)": word_lists}
