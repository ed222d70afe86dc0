"""Sharded training (FSDP2): the base model's weights and the LoRA adapter spread over the
trainer ranks, each rank holding its share of every weight (about 1/N of the model) and
gathering a layer's weights from the others only while that layer runs. What a step computes
is unchanged: the rows are dealt out as without sharding, the ranks take their passes in
lockstep (shard.py, trainer.my_rows) and the backward sums the gradients, so N sharded ranks
make the step one process makes.

A checkpoint holds the whole adapter and optimizer state, as one process writes them:
``gather`` assembles them on every rank (a collective: all ranks call it), ``scatter`` puts a
checkpoint's back, each rank keeping its share. The base model is never gathered whole.
"""

from __future__ import annotations

from typing import Any

import torch


def shard(policy: Any, device: str) -> None:
    """Spread ``policy``'s model over the process group's ranks (one FSDP unit per decoder
    layer, the rest -- embeddings, norm, head -- in the root) on ``device``, and give it a new
    AdamW over the sharded adapter weights (the old one's rate and decay). The model may be
    loaded on the CPU: each rank's share then moves to ``device``, so no device ever holds the
    whole model."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = policy.model
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (dist.get_world_size(),))
    blocks = set(getattr(model.get_base_model(), "_no_split_modules", None) or ())
    if not blocks:
        raise ValueError(f"{type(model.get_base_model()).__name__} names no decoder layer class "
                         f"(_no_split_modules) to shard by; use shard = \"none\"")
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # the ranks' gradients summed, not averaged (shard.py), by a plain SUM (gloo has no other)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    old = policy.optimizer
    params = [p for n, p in model.named_parameters() if "lora_" in n and ".policy." in n]
    policy.optimizer = torch.optim.AdamW(params, lr=old.defaults["lr"], weight_decay=old.defaults["weight_decay"])


def held(model: Any) -> dict[str, float]:
    """What this rank holds of the model's weights: parameters and bytes, and the fraction of
    all the model's parameters."""
    total = local = size = 0
    for p in model.parameters():
        mine = getattr(p, "_local_tensor", p)
        total += p.numel()
        local += mine.numel()
        size += mine.numel() * mine.element_size()
    return {"rank_params": float(local), "rank_params_fraction": local / max(total, 1),
            "rank_weights_gb": size / 2**30}


def _whole(t: Any) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def gather(model: Any, optimizer: torch.optim.Optimizer, adapter: str = "policy") -> tuple[dict[str, torch.Tensor],
                                                                                         dict[str, Any]]:
    """The whole adapter (peft's keys) and the optimizer's state (``state_dict()``'s shape), on
    the CPU. Every rank must call it, in the same order."""
    from peft import get_peft_model_state_dict

    weights = {k: _whole(v).detach().cpu().contiguous()
               for k, v in get_peft_model_state_dict(model, adapter_name=adapter).items()}
    state = optimizer.state_dict()
    whole = {i: {k: _whole(v).detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in sorted(s.items())}
             for i, s in sorted(state["state"].items())}
    return weights, {"state": whole, "param_groups": state["param_groups"]}


def scatter(model: Any, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
            optimizer_state: dict[str, Any], adapter: str = "policy") -> None:
    """Put a whole adapter and optimizer state (``gather``'s, or one process's checkpoint) into
    the sharded model: each rank copies its share. ValueError when the adapter's keys are not
    the model's."""
    from peft import get_peft_model_state_dict

    current = get_peft_model_state_dict(model, adapter_name=adapter)  # views of the sharded weights
    if set(current) != set(weights):
        raise ValueError(f"the adapter's weights do not fit this model: missing {sorted(set(current) - set(weights))[:3]}, "
                         f"unknown {sorted(set(weights) - set(current))[:3]}")
    with torch.no_grad():
        for key, view in current.items():
            view.copy_(_share(weights[key].to(view.dtype), view))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {i: {k: _share(v, params[i]) if isinstance(v, torch.Tensor) and v.shape == params[i].shape else v
                 for k, v in s.items()} for i, s in optimizer_state["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": optimizer_state["param_groups"]})


def _share(whole: torch.Tensor, like: Any) -> Any:
    """This rank's share of ``whole``, laid out as the sharded tensor ``like`` (no communication:
    every rank holds ``whole``)."""
    if not hasattr(like, "device_mesh"):
        return whole.to(like.device)
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(like._local_tensor.device), like.device_mesh, like.placements,
                             src_data_rank=None)
