"""A training step over several processes (torch.distributed ranks): every rank builds the
same rows, takes its share of each mini-batch, and the gradients and figures are summed over
ranks before the clip and the optimizer step. The loss weights are already those of the whole
mini-batch (batch.weigh), so the sum of the ranks' gradients is the single-process gradient
and N ranks make the step one process makes (up to the order of float additions).

With ``sharded`` weights (FSDP, fsdp.py) every forward and backward pass is a collective (each
rank gathers the layers' weights from the others as it goes), so the ranks take their turns in
lockstep -- a rank short of rows in a mini-batch takes a turn that adds nothing -- and the
gradients arrive already summed.

A stop (Ctrl-C) reaches one rank: the ranks ask each other at the same points (``stopped``, a
collective) and stop there together, so none is left waiting in a reduction.

One process is ``ALONE``: every row its own, every sum itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Event
from typing import Optional, Sequence, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """This process's place among ``world`` training ranks (an initialised process group)."""

    rank: int = 0
    world: int = 1
    sharded: bool = False  # the model's weights are spread over the ranks (fsdp.py)

    def mine(self, rows: Sequence[T]) -> list[T]:
        """This rank's share of one mini-batch's rows (they are sorted longest first, so dealing
        them out in turn balances the work)."""
        return list(rows[self.rank::self.world])

    def turns(self, rows: Sequence[T]) -> int:
        """How many passes this rank makes over one mini-batch: its own rows, or with sharded
        weights as many as the rank with the most (every pass is a collective)."""
        return -(-len(rows) // self.world) if self.sharded else len(self.mine(rows))

    def sum_grads(self, params: Sequence[torch.Tensor]) -> None:
        """Each parameter's gradient summed over ranks, in place (a rank that had no row of
        this mini-batch adds zeros). Sharded weights' gradients were summed by their backward."""
        if self.world == 1 or self.sharded:
            return
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        at = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[at:at + n].view_as(p).to(p.dtype)
            at += n

    def stopped(self, stop: Optional[Event]) -> bool:
        """Whether any rank was asked to stop. With several ranks every rank asks at the same
        points (a collective), so all of them stop at the first point after any was asked."""
        asked = stop is not None and stop.is_set()
        return asked if self.world == 1 else self.max([float(asked)])[0] > 0

    def alone(self, stop: Optional[Event]) -> Optional[Event]:
        """``stop`` where this process may act on it by itself (between rows): with one rank only."""
        return stop if self.world == 1 else None

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, "sum")

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, "max")

    def _reduce(self, values: Sequence[float], op: str) -> list[float]:
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as dist

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors only
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.tolist()


ALONE = Shard()
