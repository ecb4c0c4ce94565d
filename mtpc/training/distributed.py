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

from ..errors import InputError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> Dist:
    """Join the process group `torchrun` describes (NCCL on GPUs, gloo on CPUs), or run alone.

    `device`: "auto" (CUDA when available), "cpu", "cuda" or "cuda:N" (alone only: under `torchrun`
    every rank takes the GPU of its `LOCAL_RANK`, or the CPU when `device` is "cpu")."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    wanted = _device(device)
    cuda = wanted.type == "cuda"
    if world == 1:
        return Dist(0, 1, wanted)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    return Dist(rank, world, device)


def _device(name: str) -> torch.device:
    """The training device called `name`, checked before any slow work."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"--device {name!r}: training runs on cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {name}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


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
