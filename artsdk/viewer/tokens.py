"""The text of sampled token ids, for shading them by logprob: the store keeps ids, and the
base model's tokenizer turns them back into text -- when one can be found on this machine
(a model folder, the local backend's cache of converted models, the Hugging Face cache).
Without one the viewer shows the ids themselves."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Optional

_SMOLLM2 = {"HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2", "smollm2-135m", "SmolLM2-135M-Instruct"}


def _candidates(base_model: str) -> list[Path]:
    cache = Path(os.environ.get("ARTSDK_CACHE") or Path.home() / ".cache" / "artsdk").expanduser()
    out = [Path(base_model).expanduser()]
    if base_model == "tiny":
        out.append(cache / "tiny")
    if base_model in _SMOLLM2:
        out.append(cache / "SmolLM2-135M-Instruct")
    try:
        from huggingface_hub import snapshot_download

        out.append(Path(snapshot_download(base_model, local_files_only=True)))
    except Exception:  # noqa: BLE001 - not in the hub cache, or no huggingface_hub
        pass
    return out


@functools.lru_cache(maxsize=8)
def tokenizer_for(base_model: Optional[str]) -> Any:
    """A ``tokenizers.Tokenizer`` for ``base_model``, or None."""
    if not base_model:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    for folder in _candidates(base_model):
        path = folder / "tokenizer.json"
        if path.is_file():
            try:
                return Tokenizer.from_file(str(path))
            except Exception:  # noqa: BLE001 - not a tokenizer this library reads
                continue
    return None


def token_texts(base_model: Optional[str], ids: list[int]) -> Optional[list[str]]:
    """The text of each token, or None when no tokenizer is at hand."""
    tok = tokenizer_for(base_model)
    if tok is None:
        return None
    return [tok.decode([i], skip_special_tokens=False) for i in ids]
