"""Attention for packed training rows: each segment attends to itself only, computed one
segment at a time with PyTorch's fused attention kernel.

Packed rows restart their position ids at 0 for every segment; transformers turns that into
a block-diagonal mask over the whole row, and a masked attention runs the unfused kernel:
it computes and keeps (for the backward pass) every score of the row, masked or not. For a
2048-token row of short segments that is almost all waste: on SmolLM2-135M on the CPU a
training step took 1.4x as long and peaked at 2.4x the memory of 512-token rows. Segment by
segment with ``is_causal`` the fused kernel keeps nothing quadratic and computes only the
scores that count, so long rows cost what their segments cost.

    with packed_attention(model):
        model(input_ids=ids, position_ids=pos)   # pos restarts at 0 where a segment starts
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

NAME = "artsdk_packed"


def _packed_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                 position_ids: Optional[torch.Tensor] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """(batch 1, heads, tokens, dim) in, (batch 1, tokens, heads, dim) out, as transformers'
    attention functions do; segments start where ``position_ids`` is 0."""
    if position_ids is None or query.shape[0] != 1 or attention_mask is not None or query.shape[2] != key.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    n = query.shape[2]
    starts = torch.nonzero(position_ids.reshape(-1)[:n] == 0)[:, 0].tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    outs = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                           dropout_p=dropout, scale=scaling, enable_gqa=gqa)
            for a, b in zip(starts, [*starts[1:], n])]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    if NAME not in AttentionInterface._global_mapping:
        # no mask function is registered under this name: transformers then builds no mask at all
        AttentionInterface.register(NAME, _packed_sdpa)


# id(model) -> the configs packed_attention switched, with the implementation each had before
_SWITCHED: dict[int, list[tuple[Any, str]]] = {}


@contextmanager
def plain_attention(model: Any) -> Iterator[None]:
    """Inside ``packed_attention``: the model's own attention back for the block (a generation
    batch answered between training rows needs its masks)."""
    switched = _SWITCHED.get(id(model), [])
    for config, before in switched:
        config._attn_implementation = before
    try:
        yield
    finally:
        for config, _ in switched:
            config._attn_implementation = NAME


@contextmanager
def packed_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with segment-by-segment attention inside the block (not thread-safe:
    hold the lock that keeps generation off the model)."""
    _register()
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")
               and hasattr(m.config, "_attn_implementation")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    _SWITCHED[id(model)] = [(c, before[k]) for k, c in configs.items()]
    try:
        for c in configs.values():
            c._attn_implementation = NAME
        yield
    finally:
        _SWITCHED.pop(id(model), None)
        for k, c in configs.items():
            c._attn_implementation = before[k]
