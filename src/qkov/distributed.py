"""Training and weight-side analysis on several processes with PyTorch's own engine:
``torch.distributed`` (and DistributedDataParallel for training), launched by ``torchrun`` (or by
``qkov train --nproc N`` and ``qkov analyze --weights-only --nproc N``, which run torchrun for the
user).

torchrun starts one process per device and tells each its place through the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``).
The processes join one group, over NCCL between GPUs or gloo between CPU processes. Every process
holds the whole model; each computes the gradient of its own slice of every step's global batch,
and DDP averages the gradients across the group during the backward pass, so every process takes
the same optimizer step. Rank 0 alone evaluates and writes.

The analyses that pass over the layers one at a time (spectra, eigenvalue and direct copying) give
each process every ``world_size``-th layer from its rank (:func:`layer_share`) and gather every
layer's result in every process (:meth:`Processes.gather_layers`), so that each process ends with
the results of one process alone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from qkov.errors import QkovError

T = TypeVar("T")
PEER_STOPPED = "another analysis process stopped, so this one cannot go on (its error is above)"


def _collective(call: Callable[..., object], *args, **kwargs) -> None:
    """``call`` (a ``torch.distributed`` collective): a process that stopped (an error of its own,
    said in one line) closes its connections, and the others' collectives then fail with the
    backend's error; that becomes one line here too, not a traceback in every other process."""
    try:
        call(*args, **kwargs)
    except RuntimeError as err:  # gloo's errors, and NCCL's DistBackendError (a RuntimeError)
        raise QkovError(PEER_STOPPED) from err


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
            _collective(dist.barrier)

    def gather_layers(self, own: dict[int, T], n_layers: int) -> list[T]:
        """Every layer's result in layer order, from each process's ``own`` (its :func:`layer_share`'s
        results by layer) sent to all (``all_gather_object``: pickled between these processes only,
        never read from a file)."""
        shares = [own]
        if self.distributed:
            shares = [{} for _ in range(self.world_size)]
            _collective(dist.all_gather_object, shares, own)
        merged = {layer: found for share in shares for layer, found in share.items()}
        return [merged[layer] for layer in range(n_layers)]

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over every process (``values`` itself when alone)."""
        if self.distributed:
            _collective(dist.all_reduce, values, op=dist.ReduceOp.SUM)
        return values


def layer_share(n_layers: int, processes: Processes) -> range:
    """The layers this process analyses: every ``world_size``-th from its rank (all of them alone)."""
    return range(processes.rank, n_layers, processes.world_size)


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
    machine (a standalone rendezvous on a free local port), through :func:`launch`. ``--nproc``
    itself is left out: torchrun would read it as its own ``--nproc-per-node``, and the workers need
    not know it."""
    argv = [a for i, a in enumerate(argv) if not a.startswith("--nproc") and argv[i - 1 : i] != ["--nproc"]]
    return [
        sys.executable, "-m", "qkov.distributed", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "-m", "qkov", *argv,
    ]  # fmt: skip


def launch(argv: list[str]) -> None:
    """torchrun itself (``torch.distributed.run``) on ``argv``, with its report of a failed worker
    left out (a traceback of torchrun's own code, a table, log lines): the worker that failed has
    said why in one line, and the command that started torchrun says that the processes failed.
    The exit status is kept."""
    # its log lines (a worker's exit, the others stopped) only repeat what the workers said: the
    # loggers made by elastic's get_logger take LOGLEVEL as they are made (on the imports below),
    # the others their parent's level
    os.environ["LOGLEVEL"] = "CRITICAL"
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(argv)
    except ChildFailedError:
        raise SystemExit(1) from None


def run_workers(nproc: int, argv: list[str]) -> tuple[int, bool]:
    """Run ``qkov`` with ``argv`` in ``nproc`` processes under torchrun and wait for them, each with
    this process's torch threads (torchrun's own default is 1): the exit status, and whether Ctrl-C
    came (it reaches every worker too: they share the terminal's process group)."""
    interrupted = False
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}
    worker = subprocess.Popen(torchrun_command(nproc, argv), env=os.environ | threads)
    while worker.poll() is None:
        try:
            worker.wait()
        except KeyboardInterrupt:
            interrupted = True
    return worker.returncode, interrupted


def default_threads(nproc: int) -> int:
    """CPU threads per process: this machine's cores shared among its processes."""
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", nproc)))


if __name__ == "__main__":  # how torchrun_command starts torchrun
    launch(sys.argv[1:])
