"""Training on several processes with PyTorch's own engine: ``torch.distributed`` and
DistributedDataParallel, launched by ``torchrun`` (or by ``qkov train --nproc N``, which runs
torchrun for the user).

torchrun starts one process per device and tells each its place through the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``).
The processes join one group, over NCCL between GPUs or gloo between CPU processes. Every process
holds the whole model; each computes the gradient of its own slice of every step's global batch,
and DDP averages the gradients across the group during the backward pass, so every process takes
the same optimizer step. Rank 0 alone evaluates and writes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from qkov.errors import QkovError


@dataclass(frozen=True)
class Processes:
    """This process' place in the group: ``rank`` of ``world_size`` (``local_rank`` on its machine)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that evaluates, logs, prints and writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over every process (``values`` itself when alone)."""
        if self.distributed:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def current() -> Processes:
    """The group this process belongs to, or a group of one when there is none."""
    if not dist.is_available() or not dist.is_initialized():
        return Processes()
    return Processes(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def worker_device(device: torch.device, processes: Processes) -> torch.device:
    """Each process on a machine takes its own GPU: ``cuda`` becomes ``cuda:{local_rank}``."""
    if device.type == "cuda" and processes.distributed:
        if device.index not in (None, processes.local_rank):
            raise QkovError(
                f"--device {device}: under torchrun each process uses cuda:LOCAL_RANK; pass --device cuda"
            )
        return torch.device("cuda", processes.local_rank)
    return device


@contextmanager
def process_group(device: torch.device) -> Iterator[Processes]:
    """Join the group torchrun started (NCCL on GPUs, gloo on CPUs) for the duration of the block;
    outside torchrun, a group of one with no communication at all."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        yield Processes()
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    try:
        yield current()
    finally:
        dist.destroy_process_group()


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs ``qkov`` with ``argv`` in ``nproc`` processes on this
    machine (a standalone rendezvous on a free local port). ``--nproc`` itself is left out: torchrun
    would read it as its own ``--nproc-per-node``, and the workers need not know it."""
    argv = [a for i, a in enumerate(argv) if not a.startswith("--nproc") and argv[i - 1 : i] != ["--nproc"]]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "-m", "qkov", *argv,
    ]  # fmt: skip
