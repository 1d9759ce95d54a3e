"""One process per device under torchrun: this process's rank, its device, its share, and small collectives.

``torchrun --nproc-per-node N`` (``python -m torch.distributed.run``), and the cluster launchers that follow
its contract (SLURM with ``srun torchrun``, Kubernetes PyTorchJob, ...), start N copies of a command with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. ``whiflash-datagen`` and
``whiflash-eval bench`` read them here: each rank decodes its strided share of the work on device
``cuda:LOCAL_RANK``, and the ranks exchange only small Python objects (shard entries, device names, result
rows). Those travel over a **gloo** group, even on GPUs: no NCCL communicator is created, so no GPU memory
or NVLink setting is involved. Without the variables (one plain process) every function here is a no-op:
rank 0 of 1, ``barrier`` returns at once, ``gather(x)`` is ``[x]``.

Router training does not use this module: ``whiflash-train`` runs under Lightning's DDP strategy.
"""
from __future__ import annotations

import atexit
import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from whiflash import settings

__all__ = ["Ranks", "barrier", "broadcast", "from_env", "gather", "init"]

T = TypeVar("T")

TIMEOUT_ENV = settings.DIST_TIMEOUT
"""Seconds a rank waits in a collective (default one day). A rank that ends its share early waits at the
final barrier for the slowest one, which in a large datagen run can be hours later; a crashed rank never
leaves the others waiting that long, because torchrun ends every rank when one fails."""
DEFAULT_TIMEOUT_S = 24 * 3600

_GROUP: Any = None
"""The gloo group for our collectives: the default group when this module created it (or it is gloo),
else a gloo group beside the caller's own (e.g. NCCL) default group."""


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in a launch: global ``rank`` of ``world`` processes, ``local_rank`` on its host."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes what is written once (manifests, merged results)."""
        return self.rank == 0

    def describe(self, what: str) -> str:
        """``what``, naming the rank when there are several (progress bars, log lines)."""
        return what if self.world == 1 else f"{what} (rank {self.rank}/{self.world})"

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's strided share: items ``rank, rank + world, ...``. The shares of all ranks cover every
        item exactly once, and (items being in a fixed order) each rank's share is the same on every launch."""
        return list(items[self.rank :: self.world])

    def device(self, device: str, flag: str = "--device", per_device: int = 1) -> str:
        """This rank's torch device for the user's ``device``: a device type (``cuda``) becomes
        ``cuda:LOCAL_RANK // per_device`` under a launch of several processes (``per_device`` ranks share each
        GPU); ``cpu`` stays ``cpu``; one process keeps ``device`` as given. An explicit index is refused when
        several ranks would share it."""
        if per_device < 1:
            raise ValueError(f"processes per device {per_device}: expected 1 or more")
        if self.world == 1:
            return device
        kind = torch.device(device)
        if kind.type == "cpu":
            return device
        if kind.index is not None:
            raise ValueError(f"{flag} {device}: under torchrun (WORLD_SIZE={self.world}) give the device type "
                             f"('{kind.type}'); each rank then takes {kind.type}:LOCAL_RANK")
        index = self.local_rank // per_device
        if kind.type == "cuda":
            count = torch.cuda.device_count()
            if index >= count:
                raise ValueError(f"{flag} {device}: LOCAL_RANK {self.local_rank} with {per_device} process(es) per "
                                 f"device needs device {index}, but this host shows {count} CUDA device(s); start at "
                                 f"most {count * per_device} processes per host (--nproc-per-node)")
            # kernels, streams and graph captures that name no device go to the current one: make it ours
            torch.cuda.set_device(index)
        return f"{kind.type}:{index}"


def from_env() -> Ranks:
    """``Ranks`` from torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (rank 0 of 1 when unset)."""
    values = {}
    for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", None)):
        raw = os.environ.get(name)
        try:
            values[name] = default if raw is None else int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r}: expected an integer (set by torchrun)") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    local = rank if values["LOCAL_RANK"] is None else values["LOCAL_RANK"]
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"environment RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}: expected "
                         "0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0 (as torchrun sets them)")
    return Ranks(rank, world, local)


def init() -> Ranks:
    """This process's ``Ranks``; under a launch of several processes, join (once) the gloo group of the launch."""
    global _GROUP
    ranks = from_env()
    if ranks.world == 1 or _GROUP is not None:
        return ranks
    timeout = datetime.timedelta(seconds=settings.dist_timeout(DEFAULT_TIMEOUT_S))
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timeout)
        atexit.register(_destroy)  # a group left open makes torch warn at exit
        _GROUP = dist.group.WORLD
    else:  # the caller's own group (maybe NCCL): small objects still go over gloo
        _GROUP = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return ranks


def _destroy() -> None:
    global _GROUP
    if dist.is_initialized():
        dist.destroy_process_group()
    _GROUP = None


def barrier() -> None:
    """Wait until every rank gets here (no-op in one process)."""
    if _GROUP is not None:
        dist.barrier(group=_GROUP)


def gather(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable, small), in rank order, on every rank; ``[obj]`` in one process."""
    if _GROUP is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(_GROUP)
    dist.all_gather_object(out, obj, group=_GROUP)
    return out


def broadcast(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (the others pass a placeholder); ``obj`` itself in one process."""
    if _GROUP is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_GROUP)
    return box[0]
