"""artsdk: train LLM agents with reinforcement learning, keeping the agent code you have.

```python
import artsdk as art

@art.rollout
async def play(game): ...            # calls the model with the openai / litellm client

@art.reward
def won(traj: art.Trajectory) -> float: ...

groups = await art.gather(play, games, group_size=8, rewards=[won])
```

Importing artsdk is light: no torch, no litellm. Client libraries are patched for capture
when (and if) the program imports them.
"""

from . import capture as _capture
from ._version import __version__
from .backend import Backend, Endpoint, TrainableModel, TrainResult, available_backends, current_session, load_backend
from .config import Settings, configure, settings
from .errors import (
    ArtError,
    BackendError,
    CaptureError,
    ConfigError,
    ModelLoadError,
    ReplayError,
    RewardError,
    RolloutError,
    StoreError,
    TrainingError,
    TrajectoryError,
)
from .rewards import Judge, Reward, reward
from .rollout import Args, Rollout, bind, rollout, rollout_env, rollout_url
from .run import Session, gather, session
from .store import Store, default_store
from .trajectory import Choice, ErrorInfo, Group, LLMCall, Message, Trajectory, check_messages
from . import replay, testing  # noqa: E402  (submodules as art.replay / art.testing)

_capture.install()

__all__ = [
    "__version__", "Args", "ArtError", "Backend", "BackendError", "CaptureError", "Choice", "ConfigError",
    "Endpoint", "ErrorInfo", "Group", "Judge", "LLMCall", "Message", "ModelLoadError", "ReplayError", "Reward",
    "RewardError", "Rollout", "RolloutError", "Session", "Settings", "Store", "StoreError",
    "TrainResult", "TrainableModel", "TrainingError", "Trajectory", "TrajectoryError", "available_backends",
    "check_messages", "configure", "current_session", "default_store", "gather",
    "load_backend", "replay", "reward", "rollout", "rollout_env", "rollout_url", "bind", "session", "settings",
    "testing",
]
