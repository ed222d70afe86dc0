"""Text that neither SQLite nor JSON can take as it is -- lone surrogates, which Python gives
for a file name that is not UTF-8 or a ``"\\ud800"`` escape in JSON -- made storable: such a
trajectory is stored as a copy with those characters escaped (``\\ud800``), and a warning on it
says so. Nothing is lost to a character."""

from __future__ import annotations

from typing import Any

from pydantic_core import to_jsonable_python

from ..trajectory.records import Group, Trajectory

ESCAPED = ("some text of this trajectory held characters that are not valid Unicode (lone surrogates, "
           "e.g. from a file name that is not UTF-8); they were stored escaped, as \\udXXX")


def escape(value: Any) -> Any:
    """``value`` with every string that cannot be encoded as UTF-8 escaped (dicts, lists and
    tuples walked through)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {escape(k): escape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """A value as JSON-like Python (objects of the user's as their repr), escaped."""
    try:
        return escape(to_jsonable_python(escape(value), fallback=repr))
    except Exception:  # noqa: BLE001 - an object whose fields hold such text: its repr, which escapes it
        return escape(repr(value))


def storable(t: Trajectory) -> Trajectory:
    """A copy of ``t`` that can be stored, with the warning that says what was escaped."""
    data = t.model_dump(mode="python")
    for key in ("scenario", "outcome", "metadata"):
        data[key] = _plain(data[key])
    data = escape(data)
    if ESCAPED not in data["warnings"]:  # once, however often the trajectory is saved
        data["warnings"] = [*data["warnings"], ESCAPED]
    return Trajectory.model_validate(data)


def storable_group(g: Group, members: list[Trajectory]) -> Group:
    return Group(id=g.id, rollout=escape(g.rollout), scenario=_plain(g.scenario), trajectories=members)
