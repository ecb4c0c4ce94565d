"""Process-group plumbing shared by `mtpc train` and `mtpc tiny-lm` under `torchrun`.

`init_distributed()` joins the group `torchrun` describes (NCCL on GPUs, gloo on CPUs) or returns a
single-process `Dist`; the helpers below are no-ops when running alone, so the training loops have
one code path for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """Join the process group `torchrun` describes (NCCL on GPUs, gloo on CPUs), or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world == 1:
        return Dist(0, 1, torch.device("cuda" if cuda else "cpu"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    return Dist(rank, world, device)


def all_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """`t` summed over ranks (in place)."""
    if d.world > 1:
        dist.all_reduce(t)
    return t


def broadcast_from_main(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Rank 0's `t` on every rank (in place): decisions only rank 0 can take, e.g. a wall-clock budget."""
    if d.world > 1:
        dist.broadcast(t, 0)
    return t


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def wrap_ddp(module: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """`module` itself when alone, else a DistributedDataParallel around it."""
    if d.world == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [d.device.index] if d.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)
