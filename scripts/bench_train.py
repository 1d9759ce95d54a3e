"""Training throughput of whiflash-train on CPU: data pipeline, MLP step and end to end (rows/s).

    python scripts/bench_train.py --rows 1000000 --hidden_size 4096

Stages (each printed with rows/s):
  generate   write the synthetic Parquet dataset (skipped when DATA_DIR already holds it)
  open       RouterDataModule.setup("fit"): shard checks, the one-off Parquet -> memory-mapped Arrow
             conversion by `datasets` (cached afterwards), split by prompt, normalisation statistics
  pipeline-cold  the training DataLoader alone (sorted random batches gathered from the memory map, fp16),
             first pass after evicting the Arrow copy from the page cache (posix_fadvise DONTNEED; only
             effective when the Arrow copy exists from an earlier run: run the script twice)
  pipeline-warm  the same batches again, now from the page cache
  model      forward + backward + AdamW on one resident fp16 batch (the MLP alone)
  fit        Trainer.fit (no validation, no logger/checkpoint) over `steps` batches: the real loop
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import lightning as L
import torch
from jsonargparse import CLI

from whiflash.train.data import RouterDataModule
from whiflash.data import MANIFEST_NAME, read_manifest
from whiflash.train.synthetic import write_synthetic_dataset
from whiflash.train.task import RouterTask


class _Timer(L.Callback):
    """Wall time from the start of batch ``warmup`` to the end of the last batch."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.t0, self.t1, self.rows = warmup, 0.0, 0.0, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= self.warmup:
            self.rows += len(batch["gain"])
            self.t1 = time.perf_counter()


def _evict(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main(
    rows: int = 1_000_000,
    hidden_size: int = 4096,
    rounds_per_prompt: int = 50,
    data_dir: str | None = None,
    cache_dir: str | None = None,
    batch_size: int = 1024,
    mlp_dim: int = 1024,
    steps: int = 100,
    warmup: int = 5,
    threads: int | None = None,
    num_workers: int = 0,
    cold: bool = True,
) -> dict:
    """Run the benchmark and print rows/s per stage.

    Args:
        rows: dataset rows (rounds); 1M x 4096 fp16 is 8.2 GB on disk (x2 with the Arrow cache).
        hidden_size: feature width H.
        rounds_per_prompt: rounds per synthetic prompt.
        data_dir: dataset directory (default /tmp/whiflash-bench-{rows}x{hidden_size}).
        cache_dir: datasets' Arrow cache (default DATA_DIR/../{name}-cache).
        batch_size: rows per batch.
        mlp_dim: router MLP width.
        steps: timed batches per stage.
        warmup: untimed batches before each timed stage.
        threads: torch threads (default torch's choice).
        num_workers: DataLoader workers for the fit stage.
        cold: evict the Arrow copy from the page cache before opening (first pipeline pass is cold).
    """
    if threads:
        torch.set_num_threads(threads)
    data = Path(data_dir or f"/tmp/whiflash-bench-{rows}x{hidden_size}")
    cache = cache_dir or str(data.parent / f"{data.name}-cache")
    res: dict = {"rows": rows, "hidden_size": hidden_size, "batch_size": batch_size, "mlp_dim": mlp_dim,
                 "threads": torch.get_num_threads(), "num_workers": num_workers, "cpu_count": os.cpu_count(),
                 "machine": platform.platform(), "torch": torch.__version__}
    row_bytes = hidden_size * 2

    def report(stage: str, n: int, seconds: float) -> None:
        res[stage] = {"rows": n, "seconds": round(seconds, 3), "rows_per_s": round(n / seconds, 1),
                      "fp16_GB_per_s": round(n * row_bytes / seconds / 1e9, 3)}
        print(f"{stage:>14}: {n:>9} rows in {seconds:8.2f} s = {n / seconds:>10.0f} rows/s "
              f"({n * row_bytes / seconds / 1e9:.2f} GB/s of fp16 features)", flush=True)

    have = read_manifest(data) if (data / MANIFEST_NAME).is_file() else None
    if have is None or have.num_rows != rows or have.hidden_size != hidden_size:
        t = time.perf_counter()
        n = write_synthetic_dataset(data, num_prompts=-(-rows // rounds_per_prompt), rounds_per_prompt=rounds_per_prompt,
                                    hidden_size=hidden_size, seed=0).num_rows
        report("generate", n, time.perf_counter() - t)

    if cold:  # evict the memory-mapped Arrow copy (exists from a previous run) so the first pass reads the disk
        _evict(_arrow_files(cache))
    t = time.perf_counter()
    dm = RouterDataModule(str(data), batch_size=batch_size, cache_dir=cache, num_workers=0)
    dm.setup("fit")
    report("open", len(dm.data), time.perf_counter() - t)

    def pipeline(stage: str) -> None:
        it = iter(dm.train_dataloader())  # epoch 0 each time: the second pass reads the same rows
        t, n = time.perf_counter(), 0
        for _ in range(steps):
            n += len(next(it)["gain"])
        report(stage, n, time.perf_counter() - t)

    pipeline("pipeline-cold" if cold else "pipeline")
    pipeline("pipeline-warm")

    task = RouterTask(hidden_size=hidden_size, mlp_dim=mlp_dim)
    task.router.set_normalization(dm.norm_mean, dm.norm_std)
    opt = task.configure_optimizers()
    batch = next(iter(dm.train_dataloader()))
    for i in range(warmup + steps):
        if i == warmup:
            t = time.perf_counter()
        loss = task._loss(task.router(batch["hidden"]), batch["gain"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    report("model", steps * len(batch["gain"]), time.perf_counter() - t)

    dm.hparams.num_workers = num_workers
    timer = _Timer(warmup)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=warmup + steps, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        deterministic=True, callbacks=[timer], num_sanity_val_steps=0)
    trainer.fit(RouterTask(hidden_size=hidden_size, mlp_dim=mlp_dim), datamodule=dm)
    report("fit", timer.rows, timer.t1 - timer.t0)
    print(json.dumps(res))
    return res


def _arrow_files(cache: str) -> list[str]:
    return [str(p) for p in Path(cache).rglob("*.arrow")]


if __name__ == "__main__":
    CLI(main, as_positional=False)
