"""One process per device under torchrun: this process's rank, its device, its share, and small collectives.

``torchrun --nproc-per-node N`` (``python -m torch.distributed.run``), and the cluster launchers that follow
its contract (SLURM with ``srun torchrun``, Kubernetes PyTorchJob, ...), start N copies of a command with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. ``whiflash-datagen`` and
``whiflash-eval bench`` read them here: each rank decodes its strided share of the work on device
``cuda:LOCAL_RANK``, and the ranks exchange only small Python objects (shard entries, device names, result
rows). Those travel, pickled, through the launch's key-value store (torch's ``TCPStore`` at
``MASTER_ADDR:MASTER_PORT``: torchrun's agent hosts it, a launch without torchrun has rank 0 host it), not
through a process group: no gloo group or NCCL communicator is created, so no GPU memory, NVLink setting or
process-group teardown at exit is involved. A caller that has initialised its own process group before
``init`` keeps it, and the objects go over that group instead (over gloo, as a gloo group beside a NCCL one).
Without the variables (one plain process) every function here is a no-op: rank 0 of 1, ``barrier`` returns at
once, ``gather(x)`` is ``[x]``.

Router training does not use this module: ``whiflash-train`` runs under Lightning's DDP strategy.
"""
from __future__ import annotations

import datetime
import os
import pickle
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


_STORE: dist.Store | None = None
"""This launch's key-value store, under our own key prefix, once ``init`` joined a launch of several processes
that has no process group of its own; its timeout is every collective's."""
_GROUP: Any = None
"""Instead of the store: a gloo group of the caller's, when it had initialised a process group before ``init``
(its default group when that is gloo, else a gloo group beside it)."""
_RANKS = Ranks()
"""What ``init`` returned, once it joined a launch of several processes."""
_CALLS = 0
"""Collectives made over the store so far: every rank makes the same ones in the same order, so call ``n``
names the same keys on every rank."""


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
    """This process's ``Ranks``; under a launch of several processes, join (once) the launch's key-value store,
    or use the process group the caller has already initialised."""
    global _GROUP, _RANKS, _STORE
    ranks = from_env()
    if ranks.world == 1 or _STORE is not None or _GROUP is not None:
        return ranks
    timeout = datetime.timedelta(seconds=settings.dist_timeout(DEFAULT_TIMEOUT_S))
    if dist.is_initialized():  # the caller's group (maybe NCCL) and its teardown stay the caller's
        _GROUP = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    else:
        # the store init_process_group's env:// rendezvous would use: under torchrun a client of the agent's store,
        # else rank 0 hosts it. A restarted torchrun attempt shares the agent's store with the attempt that
        # failed, so the restart count keeps the keys that attempt left behind out of our calls.
        store, _, _ = next(dist.rendezvous("env://", ranks.rank, ranks.world, timeout=timeout))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _STORE = dist.PrefixStore(f"whiflash.distributed/{attempt}", store)
    _RANKS = ranks
    return ranks


def _exchange(payload: bytes) -> list[bytes]:
    """Every rank's ``payload``, in rank order, on every rank: the one step of every collective here. Over the
    store, call ``n`` has each rank set key ``n/RANK`` and wait for all of them, then every rank but 0 sets
    ``n/read/RANK`` once it has read them, and rank 0 waits for those before it returns."""
    global _CALLS
    if _GROUP is not None:
        out: list[Any] = [None] * dist.get_world_size(_GROUP)
        dist.all_gather_object(out, payload, group=_GROUP)
        return out
    assert _STORE is not None
    call, _CALLS = _CALLS, _CALLS + 1
    rank, world = _RANKS.rank, _RANKS.world
    posted = [f"{call}/{r}" for r in range(world)]
    read = [f"{call}/read/{r}" for r in range(1, world)]
    _STORE.set(posted[rank], payload)
    _STORE.wait(posted)  # within the store's timeout; a server gone (its rank crashed) fails at once
    payloads = _STORE.multi_get(posted)
    if rank:  # this rank's last use of the store in this call
        _STORE.set(read[rank - 1], b"")
    else:
        # Rank 0 returns only once every rank has read: it may then exit, taking down the store it hosts in a
        # launch without torchrun's agent, without failing a rank still reading. No key is needed any more, so
        # the store does not grow with the run.
        _STORE.wait(read)
        for key in posted + read:
            _STORE.delete_key(key)
    return payloads


def _joined() -> bool:
    """Whether ``init`` joined a launch of several processes (else the collectives are no-ops)."""
    return _STORE is not None or _GROUP is not None


def barrier() -> None:
    """Wait until every rank gets here (no-op in one process)."""
    if _joined():
        _exchange(b"")


def gather(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable, small), in rank order, on every rank; ``[obj]`` in one process."""
    if not _joined():
        return [obj]
    return [pickle.loads(payload) for payload in _exchange(pickle.dumps(obj))]


def broadcast(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (the others pass a placeholder); ``obj`` itself in one process."""
    if not _joined():
        return obj
    return pickle.loads(_exchange(pickle.dumps(obj) if _RANKS.is_main else b"")[0])
