"""``RouterDataModule``: a router dataset (docs/design.md, "The router dataset") opened memory-mapped and split by prompt.

The Parquet shards are converted once by ``datasets`` into its memory-mapped Arrow cache; ``hidden`` stays
float16 on disk and in the batch (the router casts to float32 inside ``forward``). Batches are gathered
straight from the memory map for a sorted block of row indices, so a batch costs one fp16 copy of
``B x H`` values and no per-row Python.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from whiflash.data import DatasetFormatError, check_row_values, check_shards, manifest_hash, read_manifest
from whiflash.errors import UsageError
from whiflash.flags import check_int
from whiflash.router_context import CONTEXT_FEATURES, context_from_rows, history_rows
from whiflash.speed_oracle import round_starts

from .speed import LABELS

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


class RoundBatches(Dataset):
    """Map-style dataset whose items are whole batches: ``ds[row_indices] -> dict of tensors``."""

    def __init__(self, table: Any, hidden_size: int, scalars: dict[str, np.ndarray],
                 earlier: np.ndarray | None = None) -> None:
        self.table, self.hidden_size, self.scalars = table, hidden_size, scalars
        self.earlier = earlier  # [rows, history]: the rows of the positions before each row's (a router's history)
        self._views: tuple[list[np.ndarray], np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers re-open the memory map lazily
        return {**self.__dict__, "_views": None}

    def views(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Zero-copy float16 ``[rows, H]`` views of the memory-mapped chunks, and their first row ids."""
        if self._views is None:
            table = getattr(self.table, "table", self.table)  # datasets' MemoryMappedTable wraps a pyarrow Table
            chunks = table.column("hidden").chunks
            views = [c.flatten().to_numpy(zero_copy_only=True).reshape(-1, self.hidden_size) for c in chunks]
            starts = np.cumsum([0] + [len(v) for v in views])[:-1]
            self._views = (views, starts)
        return self._views

    def hidden(self, idx: np.ndarray) -> np.ndarray:
        """Gather ``hidden[idx]`` (``idx`` sorted ascending) into a new float16 ``[len(idx), H]`` array."""
        views, starts = self.views()
        out = np.empty((len(idx), self.hidden_size), dtype=np.float16)
        chunk = np.searchsorted(starts, idx, side="right") - 1
        bounds = np.flatnonzero(np.diff(chunk)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(idx)]):
            c = chunk[lo]
            np.take(views[c], idx[lo:hi] - starts[c], axis=0, out=out[lo:hi])
        return out

    def inputs(self, idx: np.ndarray) -> np.ndarray:
        """``hidden[idx]`` (``idx`` sorted), then with a history the rows' earlier positions' states:
        float16 ``[len(idx), H * (1 + history)]``, as ``NeuralRouter`` reads them."""
        parts = [self.hidden(idx)]
        for j in range(0 if self.earlier is None else self.earlier.shape[1]):
            rows = self.earlier[idx, j]
            order = np.argsort(rows, kind="stable")  # gathered in row order, then put back in idx's
            part = np.empty_like(parts[0])
            part[order] = self.hidden(rows[order])
            parts.append(part)
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def __len__(self) -> int:
        return len(self.scalars["gain"])

    def __getitem__(self, idx: np.ndarray | list[int]) -> dict[str, torch.Tensor]:
        idx = np.asarray(idx, dtype=np.int64)
        batch = {k: torch.from_numpy(v[idx]) for k, v in self.scalars.items()}
        batch["hidden"] = torch.from_numpy(self.inputs(idx))
        return batch


class BatchIndexSampler(Sampler):
    """Yields sorted index blocks of ``batch_size``; reshuffled per epoch from ``(seed, epoch)``.

    With ``weights`` it draws ``len(indices)`` rows with replacement in proportion to the weights (class
    balancing). Sorting within a batch keeps memory-map reads local and changes nothing for the gradient.

    Under DDP (``world`` ranks) every rank draws the same global batches and yields its strided part of each,
    ``batch[rank::world]``: the ranks step together through the batches one process would see, and DDP's
    gradient average is that of the global batch (exactly when ``world`` divides its size). A global batch
    smaller than ``world`` gives each rank one of its rows, so that no rank ever steps on an empty batch.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, shuffle: bool, seed: int = 0,
                 weights: np.ndarray | None = None, rank: int = 0, world: int = 1) -> None:
        self.indices, self.batch_size, self.shuffle, self.seed, self.weights = indices, batch_size, shuffle, seed, weights
        self.rank, self.world = rank, world
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __iter__(self) -> Iterator[np.ndarray]:
        rng = np.random.default_rng([self.seed, self.epoch])
        if self.weights is not None:
            order = rng.choice(self.indices, size=len(self.indices), replace=True, p=self.weights)
        elif self.shuffle:
            order = self.indices[rng.permutation(len(self.indices))]
        else:
            order = self.indices
        for i in range(0, len(order), self.batch_size):
            batch = np.sort(order[i : i + self.batch_size])
            yield batch[self.rank :: self.world] if len(batch) >= self.world else batch[[self.rank % len(batch)]]


class RouterDataModule(L.LightningDataModule):
    """Router dataset: memory-mapped Parquet shards split by prompt, with training-split standardisation.

    Under ``--trainer.strategy ddp`` with N devices the module shards by rank itself (every rank takes every
    N-th row of each batch; Lightning's sampler replacement stays off), so N devices take the optimiser steps
    one device takes, on the same rows, and reach the same metrics.

    Args:
        path: dataset directory (Parquet shards + manifest.json; docs/design.md, "The router dataset").
        batch_size: rows per optimiser step, over all devices (under DDP each of N ranks takes every N-th row).
        val_fraction: share of prompts held out for validation (routing metrics, checkpoint selection).
        test_fraction: share of prompts held out for ``test``.
        split_seed: seed of the prompt permutation that assigns prompts to splits.
        categories: keep only rounds of these categories (e.g. ``[code, math]``); all when unset.
        balance: training-set balancing: ``none``; ``label`` re-weights rows so that ``gain > 0`` and
            ``gain <= 0`` are drawn equally often; ``category`` so that every category is; ``starts`` (rows at
            every position) draws each row as often as decodes start a round there (``round_starts``: the
            router decides only there, after a rejection, while most positions lie inside accepted runs).
        num_workers: DataLoader worker processes (each re-opens the memory map).
        norm_max_rows: rows of the training split (random, seeded) used to estimate the input mean/std.
        verify_hashes: check every shard's sha256 against the manifest before training.
        cache_dir: where ``datasets`` keeps the memory-mapped Arrow copy (default: its own cache).
        predict_split: split whose rows ``predict`` scores.
        latency_profile: a latency profile JSON (``whiflash-eval profile``) of the device the router will
            run on; with it the validation report gives the router's replayed tokens/s and its share of the
            speed oracle's gain over the better standalone drafter, and ``label speed`` becomes available.
        label: what the router regresses: ``tau`` (upstream's ``tau_0 - tau_1``) or ``speed`` (the
            tokens/s difference of the two slots with each slot's round and catch-up time, in tau units:
            ``whiflash.train.speed``; needs ``latency_profile``).
        extra_paths: more router datasets of the same target, pair, tree budget and taps, whose rows join the
            training split: e.g. ``whiflash-datagen --path router`` rows along a trained router's own decisions
            (DAgger: the router learns on the states it visits, not only on those its members' path visits).
            Rows of a prompt that ``path`` holds out for validation or test are dropped, so the validation
            metrics, the checkpoint choice and the held-out replay stay those of ``path`` alone.
        history: how many positions before the decision point the router also reads the hidden state of
            (``NeuralRouter.history``; linked into the model). Needs rows at every position
            (``whiflash-datagen --path every``), where those states are the previous rows' ``hidden``.
    """

    def __init__(
        self,
        path: str,
        batch_size: int = 1024,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        categories: list[str] | None = None,
        balance: Literal["none", "label", "category", "starts"] = "none",
        num_workers: int = 0,
        norm_max_rows: int = 200_000,
        verify_hashes: bool = True,
        cache_dir: str | None = None,
        predict_split: Literal["train", "val", "test"] = "test",
        latency_profile: str | None = None,
        label: Literal["tau", "speed"] = "tau",
        extra_paths: list[str] | None = None,
        history: int = 0,
    ) -> None:
        super().__init__()
        check_int(batch_size, "--data.batch_size")
        check_int(history, "--data.history", minimum=0)
        check_int(num_workers, "--data.num_workers", minimum=0)
        check_int(norm_max_rows, "--data.norm_max_rows")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(f"need 0 <= val_fraction, test_fraction and val+test < 1, got {val_fraction}, {test_fraction}")
        self.save_hyperparameters()
        self.path = Path(path)
        # Reading the manifest here (cheap) lets LightningCLI link these attributes into the model.
        self.manifest = read_manifest(self.path, "--data.path")
        self.hidden_size: int = self.manifest.hidden_size
        self.pair: str = str(self.manifest.pair)  # a name, as LightningCLI links it into RouterTask(pair=...)
        self.tree_budget: int | None = self.manifest.tree_budget
        self.target: str = self.manifest.target
        self.tap_layers: list[int] = list(self.manifest.tap_layers)
        self.history: int = history
        if history and not self.manifest.every_position:
            raise UsageError(f"--data.history {history}: {self.path} has rows on one decoding path, which hold the "
                             "decision points' states only; the states of the positions before them are in rows at "
                             "every position (whiflash-datagen --parallel --path every)")
        if balance == "starts" and (not self.manifest.every_position or extra_paths):
            raise UsageError(f"--data.balance starts: weighs rows at every position (whiflash-datagen --parallel --path "
                             f"every) by how often decodes start a round there; {self.path} has rows on one decoding "
                             "path" if not self.manifest.every_position else
                             "--data.balance starts: --data.extra_paths rows lie on one decoding path, not at every "
                             "position; train on --data.path alone")
        self.extra_paths = [Path(e) for e in extra_paths or []]
        self.extra_manifests = [self._read_extra(e) for e in self.extra_paths]
        self.profile = self._read_profile(latency_profile, label)
        self.data: RoundBatches | None = None
        self.split_indices: dict[str, np.ndarray] = {}
        self.norm_mean: torch.Tensor | None = None
        self.norm_std: torch.Tensor | None = None
        self.context_mean: torch.Tensor | None = None
        self.context_std: torch.Tensor | None = None

    def _read_profile(self, path: str | None, label: str) -> Any:
        """The latency profile, checked against the data's slots now rather than after training."""
        if label not in LABELS:
            raise UsageError(f"--data.label: expected one of {', '.join(LABELS)}, got {label!r}")
        if path is None:
            if label == "speed":
                raise UsageError("--data.label speed needs --data.latency_profile FILE (a latency profile from "
                                 "`whiflash-eval profile` on the device the router will run on)")
            return None
        from whiflash.latency import LatencyProfile

        profile = LatencyProfile.read(path, flag="--data.latency_profile")
        for kind in self.manifest.pair.slots:
            try:
                profile.round_ms(kind, self.manifest.tree_budget)
                profile.catchup_ms(kind, 1)
            except ValueError as err:
                raise UsageError(f"--data.latency_profile: {err} (needed for the slots of {self.path})") from None
        return profile

    def _read_extra(self, path: Path) -> Any:
        """An ``extra_paths`` dataset's manifest, refused unless its rows describe the main dataset's routing
        problem (same target, pair, tree budget, tap layers and width)."""
        extra = read_manifest(path, "--data.extra_paths")
        for field in ("target", "pair", "tree_budget", "tap_layers", "hidden_size"):
            theirs, ours = getattr(extra, field), getattr(self.manifest, field)
            if theirs != ours:
                raise DatasetFormatError(f"--data.extra_paths {path}: manifest field {field} is {theirs!r}, but "
                                         f"--data.path {self.path} has {ours!r}; expected rows of the same target, "
                                         "pair, tree budget, tap layers and hidden size")
        return extra

    @property
    def manifest_sha256(self) -> str:
        return manifest_hash(self.path)

    @property
    def extra_manifest_sha256(self) -> list[str]:
        return [manifest_hash(p) for p in self.extra_paths]

    def setup(self, stage: str) -> None:
        if self.data is None:
            self._open()
        needed = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",),
                  "predict": (self.hparams.predict_split,)}.get(stage, ())
        for split in needed:
            if len(self.split_indices[split]) == 0:
                n_prompts = len(self.prompt_names)
                raise ValueError(
                    f"{split} split of {self.path} is empty: {n_prompts} prompt(s) after the category filter "
                    f"{self.hparams.categories or 'none'} with val_fraction={self.hparams.val_fraction}, "
                    f"test_fraction={self.hparams.test_fraction}; expected at least one prompt in each split "
                    "(use more prompts, other fractions or fewer category filters)")
        if stage == "fit" and self.norm_mean is None:
            self._fit_normalization()

    def _open(self) -> None:
        import datasets

        shard_paths = check_shards(self.path, self.manifest, verify_hashes=self.hparams.verify_hashes)
        if self.manifest.num_rows == 0:
            raise DatasetFormatError(f"router dataset {self.path}: its {len(shard_paths)} shard(s) "
                                     f"{[p.name for p in shard_paths]} hold no rows (expected at least one round)")
        shards = [(p, s.rows) for p, s in zip(shard_paths, self.manifest.shards)]
        for path, extra in zip(self.extra_paths, self.extra_manifests):
            paths = check_shards(path, extra, verify_hashes=self.hparams.verify_hashes)
            shards += [(p, s.rows) for p, s in zip(paths, extra.shards)]
        ds = datasets.load_dataset("parquet", data_files={"train": [str(p) for p, _ in shards]}, split="train",
                                   cache_dir=self.hparams.cache_dir, writer_batch_size=1 << 20)
        table = ds.data.table if hasattr(ds.data, "table") else ds.data
        # refuse NaN/inf and inconsistent labels before anything is fitted on them
        check_row_values(table, shards)
        # which dataset each row is from (0: --data.path), in the shards' order
        source = np.repeat(np.arange(1 + len(self.extra_paths)),
                           [self.manifest.num_rows, *(m.num_rows for m in self.extra_manifests)])
        prompt = table.column("prompt_id").combine_chunks().dictionary_encode()
        category = table.column("category").combine_chunks().dictionary_encode()
        self.categories = [str(c) for c in category.dictionary.to_pylist()]
        cat_codes = category.indices.to_numpy().astype(np.int64)
        keep = np.ones(table.num_rows, dtype=bool)
        if self.hparams.categories:
            unknown = sorted(set(self.hparams.categories) - set(self.categories))
            if unknown:
                raise ValueError(f"category filter {unknown} not in {self.path} (it has categories {self.categories})")
            keep = np.isin(cat_codes, [self.categories.index(c) for c in self.hparams.categories])
        # Split by prompt, never by row: correlated rounds of one prompt must stay on one side.
        names = np.asarray(prompt.dictionary.to_pylist(), dtype=object)
        codes = prompt.indices.to_numpy().astype(np.int64)
        kept = np.unique(codes[keep & (source == 0)])
        kept = kept[np.argsort(names[kept])]  # order by name so the split does not depend on row order
        self.prompt_names = [str(n) for n in names[kept]]
        order = kept[np.random.default_rng(self.hparams.split_seed).permutation(len(kept))]
        n_val = int(round(self.hparams.val_fraction * len(kept)))
        n_test = int(round(self.hparams.test_fraction * len(kept)))
        split_of = np.full(len(names), -1, dtype=np.int64)
        split_of[order[:n_val]] = 1
        split_of[order[n_val : n_val + n_test]] = 2
        split_of[order[n_val + n_test :]] = 0
        row_split = np.where(keep, split_of[codes], -1)
        if self.extra_paths:  # extra rows train, unless --data.path holds their prompt out
            extra = keep & (source > 0)
            held_out = extra & np.isin(split_of[codes], (1, 2))
            row_split[extra] = np.where(held_out[extra], -1, 0)
            split_of[np.unique(codes[extra & ~held_out])] = 0
            log.info("extra datasets: %d rows join the training split, %d rows of held-out prompts are dropped",
                     int((extra & ~held_out).sum()), int(held_out.sum()))
        self.split_indices = {s: np.flatnonzero(row_split == i) for i, s in enumerate(SPLITS)}
        self.split_prompts = {s: sorted(str(n) for n in names[split_of == i]) for i, s in enumerate(SPLITS)}
        scalars = {
            "gain": table.column("gain").to_numpy().astype(np.float32),
            "tau_0": table.column("tau_0").to_numpy().astype(np.int64),
            "tau_1": table.column("tau_1").to_numpy().astype(np.int64),
            "category": cat_codes,
            "row": np.arange(table.num_rows, dtype=np.int64),
            # where each round sits in its prompt: the speed label and replay follow a prompt's rounds in order
            # (a prompt's rows in two datasets are two sequences)
            "prompt": np.unique(np.stack([source, codes]), axis=1, return_inverse=True)[1].reshape(-1)
                      if self.extra_paths else codes,
            "round": table.column("round").to_numpy().astype(np.int64),
            "position": table.column("position").to_numpy().astype(np.int64),
        }
        # how much each row counts as a decision point: at every position, the chance a decode starts a round
        # there (most positions lie inside an accepted run, where no decode decides); a path's rows are all one
        scalars["weight"] = (round_starts(scalars["prompt"], scalars["position"], scalars["tau_0"], scalars["tau_1"])
                             if self.manifest.every_position and not self.extra_paths
                             else np.ones(table.num_rows)).astype(np.float32)
        # every context feature a router may read (whiflash.router_context); the task picks its own columns
        scalars["context"] = context_from_rows(CONTEXT_FEATURES, scalars["prompt"], scalars["round"],
                                               table.column("entropy").to_numpy().astype(np.float32),
                                               scalars["tau_0"], scalars["tau_1"], table.column("active").to_numpy())
        if self.hparams.label == "speed":
            from .speed import speed_gain

            scalars["gain"] = speed_gain(scalars["prompt"], scalars["round"], scalars["position"], scalars["tau_0"],
                                         scalars["tau_1"], table.column("active").to_numpy(),
                                         tuple(self.manifest.pair.slots), self.profile, self.manifest.tree_budget)
        earlier = history_rows(scalars["prompt"], scalars["position"], self.history) if self.history else None
        self.data = RoundBatches(ds.data, self.hidden_size, scalars, earlier)
        log.info("opened %s%s: %d rows, %s", self.path,
                 f" + {', '.join(map(str, self.extra_paths))}" if self.extra_paths else "", table.num_rows,
                 {s: f"{len(self.split_prompts[s])} prompts/{len(self.split_indices[s])} rows" for s in SPLITS})

    def _fit_normalization(self) -> None:
        """Mean/std of ``hidden`` over (a seeded sample of) the training split only; of the context features
        over the whole training split."""
        idx = self.split_indices["train"]
        if len(idx) > self.hparams.norm_max_rows:
            rng = np.random.default_rng([self.hparams.split_seed, 1])
            idx = np.sort(rng.choice(idx, size=self.hparams.norm_max_rows, replace=False))
        total = np.zeros(self.hidden_size, dtype=np.float64)
        total_sq = np.zeros(self.hidden_size, dtype=np.float64)
        for i in range(0, len(idx), 8192):
            h = self.data.hidden(idx[i : i + 8192]).astype(np.float64)
            total += h.sum(0)
            total_sq += np.square(h).sum(0)
        mean = total / len(idx)
        var = np.maximum(total_sq / len(idx) - np.square(mean), 0.0)
        self.norm_mean = torch.from_numpy(mean).float()
        self.norm_std = torch.from_numpy(np.sqrt(var)).float()
        ctx = self.data.scalars["context"][self.split_indices["train"]].astype(np.float64)
        self.context_mean = torch.from_numpy(ctx.mean(0)).float()
        self.context_std = torch.from_numpy(ctx.std(0)).float()

    def _weights(self, idx: np.ndarray) -> np.ndarray | None:
        mode = self.hparams.balance
        if mode == "none":
            return None
        if mode == "starts":
            w = self.data.scalars["weight"][idx].astype(np.float64)
            return w / w.sum()
        key = (self.data.scalars["gain"][idx] > 0).astype(np.int64) if mode == "label" else self.data.scalars["category"][idx]
        counts = np.bincount(key)
        w = 1.0 / counts[key]
        return w / w.sum()

    def loader(self, split: str, train: bool = False, rank: int = 0, world: int = 1) -> DataLoader:
        """DataLoader over ``split``; ``train`` shuffles per epoch (and balances, if asked); ``rank`` of
        ``world`` DDP ranks gets its part of every batch (the default, one rank, gets all of it)."""
        idx = self.split_indices[split]
        sampler = BatchIndexSampler(idx, self.hparams.batch_size, shuffle=train, seed=self.hparams.split_seed,
                                    weights=self._weights(idx) if train else None, rank=rank, world=world)
        return DataLoader(self.data, batch_size=None, sampler=sampler, num_workers=self.hparams.num_workers,
                          persistent_workers=self.hparams.num_workers > 0)

    def _trainer_loader(self, split: str, train: bool = False) -> DataLoader:
        """``loader`` for this rank of the attached trainer."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return self.loader(split, train)
        # Lightning would wrap our sampler in a DistributedSampler and split the batches a second time
        if getattr(getattr(trainer, "_accelerator_connector", None), "use_distributed_sampler", False):
            raise ValueError("--trainer.use_distributed_sampler true: RouterDataModule shards every batch by rank "
                             "itself; expected false (whiflash-train's default)")
        return self.loader(split, train, trainer.global_rank, trainer.world_size)

    def train_dataloader(self) -> DataLoader:
        return self._trainer_loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._trainer_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._trainer_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._trainer_loader(self.hparams.predict_split)
