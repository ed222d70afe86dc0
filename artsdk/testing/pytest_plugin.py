"""artsdk's pytest plugin (registered through the ``pytest11`` entry point): the
``art_store`` fixture, an empty SQLite store in the test's temporary folder, made the
default store for the test.

```python
def test_rollout_is_stored(art_store):
    traj = my_rollout.collect_sync(scenario)
    assert art_store.get(traj.id).outcome == traj.outcome
```
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest


@pytest.fixture(name="art_store")
def art_store(tmp_path: Any) -> Iterator[Any]:
    from .. import config
    from ..store import default_store

    config.configure(store=str(tmp_path / "store.db"), home=str(tmp_path / ".artsdk"))
    try:
        yield default_store()
    finally:
        config.configure(store=None, home=None)  # closes it
