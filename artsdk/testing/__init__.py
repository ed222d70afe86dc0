"""Test helpers: trajectories built by hand for testing rewards offline (``trajectory``), the
``art_store`` pytest fixture (``pytest_plugin``), and ``MockServer``, a scripted model server on
127.0.0.1 (``artsdk.testing.mock_server``; it needs fastapi and uvicorn, so it is imported on
its own). ``from artsdk.testing import trajectory``: see its docs for an example.
"""

from .trajectories import trajectory

__all__ = ["trajectory"]
