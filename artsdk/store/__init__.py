"""The trajectory store: SQLite by default (WAL mode), any SQLAlchemy URL for teams.

```python
store = art.Store("runs/store.db")                  # or "postgresql+psycopg://..."
best = store.trajectories(project="ttt", min_reward=0.9, limit=20)
store.export_jsonl("ttt.jsonl", project="ttt")
groups = store.groups(project="ttt", model="agent", step=3)   # back to art.Group for training
```

``Store`` (store.py) is what users call; the tables, the rows, the queries and the writer
thread are the modules beside it.
"""

from .default import default_store, reset_default
from .store import Store, wait

__all__ = ["Store", "default_store", "reset_default", "wait"]
