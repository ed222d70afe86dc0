"""Serving an adapter merged into the base weights.

Decoding runs a LoRA pair beside every adapted linear layer: at a few tokens per forward
pass those extra small matmuls cost as much as the layer itself (generation at step 1 took
~1.8x as long as at step 0 on SmolLM2-135M). Merged, W' = W + scale * B @ A, the forward pass
is the plain model again. The original weights stay untouched: the merged ones live in a
second buffer, and the layers are pointed back at the originals before training.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


class Merger:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = [m for _, m in model.named_modules()
                       if hasattr(m, "lora_A") and hasattr(m, "base_layer") and hasattr(m.base_layer, "weight")]
        # per layer: the original weight tensor and a buffer of the same shape for the merged
        # one; switching is swapping which of the two the layer points at (no copy, no drift)
        self.pristine = [m.base_layer.weight.data for m in self.layers]
        self.buffers: Optional[list[torch.Tensor]] = None
        self.merged: Optional[str] = None

    @torch.no_grad()
    def merge(self, adapter: str) -> None:
        """Base weights + ``adapter``; run the model with adapters disabled afterwards."""
        if self.merged == adapter:
            return
        if self.buffers is None:
            self.buffers = [torch.empty_like(w) for w in self.pristine]
        for m, w0, buf in zip(self.layers, self.pristine, self.buffers):
            if adapter not in m.lora_A:
                buf.copy_(w0)
            elif getattr(m, "fan_in_fan_out", False):  # weights stored transposed (GPT-2 style)
                delta = (m.lora_B[adapter].weight @ m.lora_A[adapter].weight) * m.scaling[adapter]
                torch.add(w0, delta.T.to(w0.dtype), out=buf)
            else:  # one fused w0 + scale * B @ A, no temporary
                torch.addmm(w0, m.lora_B[adapter].weight.to(w0.dtype), m.lora_A[adapter].weight.to(w0.dtype),
                            alpha=m.scaling[adapter], out=buf)
            m.base_layer.weight.data = buf
        self.merged = adapter

    def restore(self) -> None:
        """The original base weights back."""
        if self.merged is None:
            return
        for m, w0 in zip(self.layers, self.pristine):
            m.base_layer.weight.data = w0
        self.merged = None

    def release(self) -> None:
        """The original base weights back, and the merged copy let go (a training step does not
        need it, and the next merge makes it anew: about the size of the adapted layers)."""
        self.restore()
        self.buffers = None
