"""Short product reviews with a known label, from a seeded generator."""

from __future__ import annotations

import random
from dataclasses import dataclass

GOOD = ["delicious", "friendly", "wonderful", "excellent", "lovely", "fantastic", "great", "perfect", "quick",
        "comfortable", "cheap", "bright"]
BAD = ["awful", "rude", "terrible", "horrible", "cold", "disappointing", "bad", "broken", "slow", "noisy",
       "overpriced", "dirty"]
THINGS = ["the food", "the staff", "the room", "the service", "the movie", "the phone", "the book", "the coffee",
          "the delivery", "the bed", "the screen", "the price"]
TEMPLATES = ["{a} was {x} and {b} was {y}.", "I found {a} {x}, and {b} {y}.", "{a} is {x}; {b} is {y} too.",
             "Honestly, {a} was {x} and {b} was {y}."]


@dataclass(frozen=True)
class Review:
    text: str
    label: str  # "positive" or "negative"


def reviews(n: int, seed: int) -> list[Review]:
    """``n`` reviews, half of each label on average; the same seed gives the same reviews."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["positive", "negative"])
        x, y = rng.sample(GOOD if label == "positive" else BAD, 2)
        a, b = rng.sample(THINGS, 2)
        text = rng.choice(TEMPLATES).format(a=a, b=b, x=x, y=y)
        out.append(Review(text=text[0].upper() + text[1:], label=label))
    return out
