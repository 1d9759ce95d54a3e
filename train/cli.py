"""``whiflash-train``: LightningCLI (``fit``/``validate``/``test``/``predict``) for the neural router, plus ``push``.

Examples::

    whiflash-train fit --data.path DATA --trainer.default_root_dir runs/train
    whiflash-train fit --print_config > router.yaml; whiflash-train fit --config router.yaml
    whiflash-train test --data.path DATA --ckpt_path RUN/checkpoints/router-....ckpt
    whiflash-train push --router RUN/router --repo-id ORG/Qwen3-8B-NeuralRouter-df-e3
    whiflash-train fit --data.path DATA --trainer.devices 2 --trainer.strategy ddp   # one process per device

Every run gets its own directory ``<default_root_dir>/<YYYYmmdd-HHMMSS>_<run_name>/`` with the resolved
``config.yaml``, ``metrics.csv`` and ``manifest.json`` (kind ``whiflash.train``: argv, versions, data hash),
after ``fit`` also ``checkpoints/``, the exported ``router/`` folder, ``router.safetensors``, ``results.json``
and ``plots/``. ``--trainer.default_root_dir`` holds run folders and may not itself be one (of any tool).
Under DDP, rank 0 writes them once (docs/multi_gpu.md).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger

from whiflash.containment import plain_name
from whiflash.errors import run_cli
from whiflash.flags import check_int
from whiflash.folders import MANIFEST, TRAIN, check_folder
from whiflash.io import atomic_write_text
from whiflash.locks import SCAFFOLDING, claim, owning_folders
from whiflash.versions import package_versions

from .data import RouterDataModule
from .task import RouterTask

log = logging.getLogger(__name__)

LINKED_FROM_DATA = ("hidden_size", "pair", "tree_budget", "target", "tap_layers", "history")
RUN_FOLDER = "run folder (--trainer.default_root_dir/--run_name)"
RUN_SCAFFOLDING = SCAFFOLDING | {"hparams.yaml"}
"""What a run folder holds before its first result (a refused or failed fit removes a folder of only these)."""
DESCRIPTION = ("Train, evaluate and export the WhiFlash-Neural router (LightningCLI). "
               "Upload an exported router with `whiflash-train push --router DIR --repo-id ORG/NAME` "
               "(see `whiflash-train push --help`).")


class RouterCLI(LightningCLI):
    """LightningCLI with the data->model links, checkpoint/early-stopping defaults, run dirs and export."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--run_name", type=str, default="router", help="Suffix of the run directory name.")
        parser.add_argument("--num_threads", type=int | None, default=None,
                            help="torch CPU threads (default: torch's choice; 1 is fastest for small routers on "
                                 "a busy CPU, where threads spin waiting for each other).")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": "val/share", "checkpoint.mode": "max", "checkpoint.save_top_k": 1,
            "checkpoint.filename": "router-epoch{epoch:02d}-share{val/share:.4f}",
            "checkpoint.auto_insert_metric_name": False,
        })
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.set_defaults({"early_stopping.monitor": "val/share", "early_stopping.mode": "max",
                             "early_stopping.patience": 5})
        # The feature width (and what the router is for) come from the dataset manifest, never from flags.
        for key in LINKED_FROM_DATA:
            parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        check_int(cfg.get("num_threads"), "--num_threads", optional=True)
        plain_name(cfg.get("run_name") or "router", "--run_name")  # one folder inside the root, never a path
        if cfg.get("num_threads"):
            torch.set_num_threads(cfg["num_threads"])

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        cfg = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer_cfg = cfg["trainer"]
        root = Path(trainer_cfg.get("default_root_dir") or "runs/train")
        # run folders go inside root; a root that is itself a dataset, testbed or run is a mistaken flag
        check_folder(root, None, "--trainer.default_root_dir")
        if trainer_cfg.get("logger") in (None, True):
            name = plain_name(cfg.get("run_name") or "router", "--run_name")
            version = _fresh_version(root, name, self.subcommand)
            if _first_process():  # the folder is this run's until it ends (other DDP ranks write through rank 0)
                claim(root / version, RUN_FOLDER, scaffolding=RUN_SCAFFOLDING)
                # the folder is new: the logger's "exists and is not empty" sees only the lock file
                warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
            kwargs["logger"] = CSVLogger(save_dir=str(root), name="", version=version)
        return super().instantiate_trainer(**kwargs)

    def before_fit(self) -> None:
        """Read and check the dataset before the run folder exists, so a refused dataset leaves nothing behind."""
        self.datamodule.setup("fit")

    def after_fit(self) -> None:
        from .export import export_run
        from .plots import plot_run

        trainer, dm = self.trainer, self.datamodule
        run_dir = self._run_dir()
        if not trainer.is_global_zero:  # rank 0 exports, plots and writes the manifest once
            return
        ckpt_cb = trainer.checkpoint_callback
        ckpt = ckpt_cb.best_model_path if isinstance(ckpt_cb, ModelCheckpoint) and ckpt_cb.best_model_path else None
        if ckpt is None:
            log.warning("no best checkpoint (validation/checkpointing disabled?); exporting the final weights")
        results = export_run(self.model, dm, run_dir, ckpt)
        plot_run(run_dir, results, dm.manifest.drafter_ids)
        es = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
        self._write_manifest(run_dir, {
            "splits": {s: {"prompts": len(dm.split_prompts[s]), "rows": int(len(dm.split_indices[s]))}
                       for s in dm.split_indices},
            "best_checkpoint": ckpt, "epochs": trainer.current_epoch, "global_step": trainer.global_step,
            "devices": trainer.world_size,
            "stopping_reason": str(getattr(es, "stopping_reason", None)) if es is not None else None,
            "val": {k: results[k] for k in ("mse", "mae", "spearman", "auroc")},
            "val_routing": {k: v for k, v in results["routing"].items() if k not in ("tau_router", "thresholds")},
            "val_speed": results["speed"]["overall"] if "speed" in results else None,
            "outputs": {"router_dir": results["router_dir"], "router_file": results["router_file"]},
        })

    def after_validate(self) -> None:
        """Every run folder gets its typed manifest, not only fit's."""
        self._write_manifest(self._run_dir(), {})

    after_test = after_validate

    def after_predict(self) -> None:
        """Write ``predictions.parquet`` (row id into the dataset, predicted and logged gain) into the run dir."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        batches = self.trainer.predict_loop.predictions or []
        cols = {k: torch.cat([b[k] for b in batches]).numpy() for k in ("row", "pred", "gain")} if batches else None
        if self.trainer.world_size > 1:  # each rank scored part of every batch: join them in row order
            parts: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(parts, cols)
            parts = [p for p in parts if p is not None]
            cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else None
            if cols is not None:  # sorted by row; a row several ranks scored (a batch of fewer than N rows) once
                _, first = np.unique(cols["row"], return_index=True)
                cols = {k: v[first] for k, v in cols.items()}
        path = self._run_dir() / "predictions.parquet"
        if cols is None or not self.trainer.is_global_zero:
            return
        pq.write_table(pa.table(cols), path)
        log.info("wrote %d predictions (%s split) to %s", len(cols["row"]), self.datamodule.hparams.predict_split, path)
        self._write_manifest(path.parent, {"outputs": {"predictions": path.name}})

    def _run_dir(self) -> Path:
        """The run folder. Under DDP `log_dir` is a broadcast, so every rank must ask, not only rank 0."""
        return Path(self.trainer.log_dir or self.trainer.default_root_dir)

    def _write_manifest(self, run_dir: Path, extra: dict[str, Any]) -> None:
        """``manifest.json`` of the run folder (kind ``whiflash.train``: argv, versions, data), after any
        subcommand; rank 0 writes it."""
        if not self.trainer.is_global_zero:
            return
        versions = package_versions("whiflash", "torch", "lightning", "torchmetrics", "datasets", "huggingface_hub",
                                    "safetensors")
        manifest = {"kind": TRAIN, "tool": "whiflash-train", "subcommand": self.subcommand, "argv": sys.argv,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_sha": _git_sha(), "versions": versions,
                    "python": platform.python_version(), "machine": platform.platform(),
                    "data": str(self.datamodule.path), "data_manifest_sha256": self.datamodule.manifest_sha256,
                    "extra_data": [str(p) for p in self.datamodule.extra_paths],
                    "extra_data_manifest_sha256": self.datamodule.extra_manifest_sha256, **extra}
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / MANIFEST, json.dumps(manifest, indent=2, default=str))


def _fresh_version(root: Path, name: str, subcommand: str | None) -> str:
    """``YYYYmmdd-HHMMSS_name[-subcommand]``, suffixed so that an existing run directory is never reused."""
    base = time.strftime("%Y%m%d-%H%M%S") + f"_{name}" + ("" if subcommand in (None, "fit") else f"-{subcommand}")
    version, i = base, 1
    while (root / version).exists():
        version, i = f"{base}-{i}", i + 1
    return version


def _first_process() -> bool:
    """Whether this is the launch's first process (rank 0 of torchrun, or Lightning's DDP parent)."""
    return all(os.environ.get(v, "0") == "0" for v in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _push_argv(argv: list[str]) -> list[str]:
    """Accept upstream-style ``--repo-id`` and a bare ``--private`` (jsonargparse wants ``--repo_id``/``--private true``)."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            a = "--" + name[2:].replace("-", "_") + eq + value
            if a == "--private" and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
                out += ["--private", "true"]
                continue
        out.append(a)
    return out


def _push_main(argv: list[str]) -> str:
    from jsonargparse import CLI

    from .push import push

    return CLI(push, args=_push_argv(argv), as_positional=False, prog="whiflash-train push")


def main(args: list[str] | None = None) -> None:
    """The ``whiflash-train`` command; ``args`` replaces ``sys.argv[1:]``. It ends with exit status 2 (bad usage
    or input) or 1 (a failure while running, such as a push the Hub refuses) and a one-line ``error:`` message
    (repo and what to do, for a push); ``--debug`` or ``WHIFLASH_DEBUG=1`` adds the traceback. In-process
    callers that want the exceptions use :func:`run`."""

    def command(argv: list[str]) -> int:
        run(argv)
        return 0

    run_cli("whiflash-train", command, args)


@owning_folders()  # the run folder is this run's until it ends; a refused run removes it again
def run(args: list[str] | None = None) -> RouterCLI | str:
    """Run ``whiflash-train`` and return the LightningCLI object (or the commit URL for ``push``)."""
    argv = list(sys.argv[1:] if args is None else args)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if argv[:1] == ["push"]:
        url = _push_main(argv[1:])
        print(url)
        return url
    return RouterCLI(
        RouterTask,
        RouterDataModule,
        args=args,
        seed_everything_default=1234,
        # the data module shards batches by rank itself under DDP (RouterDataModule), so no sampler replacement
        trainer_defaults={"deterministic": True, "max_epochs": 20, "default_root_dir": "runs/train",
                          "log_every_n_steps": 10, "use_distributed_sampler": False},
        save_config_kwargs={"overwrite": False},
        parser_kwargs={"description": DESCRIPTION},
    )


if __name__ == "__main__":
    main()
