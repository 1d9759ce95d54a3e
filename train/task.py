"""``RouterTask``: the LightningModule (loss, metrics, optimiser) around :class:`whiflash.router.NeuralRouter`."""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, SpearmanCorrCoef

from whiflash.errors import UsageError
from whiflash.flags import check_int, check_number
from whiflash.pairs import Pair
from whiflash.router import NeuralRouter
from whiflash.router_context import check_context, context_columns

from .metrics import DEFAULT_THRESHOLDS, BinnedAUROC, RoutingTau

log = logging.getLogger(__name__)

STAGES = ("train", "val", "test")
LOSSES = ("mse", "huber", "decision")
"""What ``--model.loss`` may name (``RouterTask``)."""


class RouterTask(L.LightningModule):
    """Regress the acceptance-length gain ``tau_0 - tau_1`` from the target's final hidden state.

    Args:
        hidden_size: feature width H (linked from the dataset by ``whiflash-train``).
        mlp_dim: width of the router's hidden layer.
        dropout: dropout in the router MLP.
        loss: ``mse`` (estimates the conditional mean gain, which is what thresholding needs), ``huber``, or
            ``decision``: a logistic loss on whether slot 0 is the better choice (gain > 0), each row weighted by
            the size of its gain, the tau (or tokens/s) a wrong choice there forgoes. The score is then a
            log-odds, with the same sign as the conditional mean gain where it is fitted exactly; with finite
            data it spends the router's capacity on the choice instead of on the size of gains.
        huber_delta: transition point of the Huber loss, in tau units.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        thresholds: grid of thresholds theta for the routing replay (default -4.0 .. 4.0 step 0.25).
        auroc_threshold: AUROC is computed for the label ``gain > auroc_threshold``.
        auroc_bins: number of thresholds of the binned (constant-memory) AUROC.
        pair: drafter pair of the data, e.g. ``df-e3`` (linked from the dataset manifest).
        tree_budget: DDTree budget of the data (linked from the dataset manifest).
        target: target model of the data (linked from the dataset manifest).
        tap_layers: tap layers recorded in the data (linked from the dataset manifest).
        context: context features the router reads after the hidden state, e.g. ``[entropy, prev_tau]``
            (``whiflash.router_context``: ``entropy``, ``prev_slot``, ``prev_tau``); none by default, the
            upstream contract.
        history: positions before the decision point whose hidden states the router also reads (linked from
            ``--data.history``).
    """

    def __init__(
        self,
        hidden_size: int,
        mlp_dim: int = 1024,
        dropout: float = 0.0,
        loss: Literal["mse", "huber", "decision"] = "mse",
        huber_delta: float = 1.0,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        thresholds: list[float] | None = None,
        auroc_threshold: float = 0.0,
        auroc_bins: int = 200,
        pair: str = "df-e3",
        tree_budget: int | None = None,
        target: str = "",
        tap_layers: list[int] | None = None,
        context: list[str] | None = None,
        history: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_int(mlp_dim, "--model.mlp_dim")
        check_int(auroc_bins, "--model.auroc_bins", minimum=2)
        check_number(lr, "--model.lr", 0, above=True)
        check_number(weight_decay, "--model.weight_decay", 0)
        check_number(huber_delta, "--model.huber_delta", 0, above=True)
        if loss not in LOSSES:
            raise UsageError(f"--model.loss: expected one of {', '.join(LOSSES)}, got {loss!r}")
        if not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
            raise UsageError(f"--model.dropout: expected a probability in [0, 1), got {dropout!r}")
        pair = str(Pair.parse(pair, what="--model.pair"))
        try:
            context = list(check_context(context, "--model.context"))
        except ValueError as err:
            raise UsageError(str(err)) from None
        self.router = NeuralRouter(hidden_size=hidden_size, mlp_dim=mlp_dim, dropout=dropout, drafters=pair,
                                   tree_budget=tree_budget, target=target, tap_layers=tap_layers, context=context,
                                   history=history)
        #: the columns of a batch's ``context`` (all of CONTEXT_FEATURES) this router reads
        self.context_columns = context_columns(context)
        self.thresholds = list(thresholds) if thresholds else list(DEFAULT_THRESHOLDS)
        with warnings.catch_warnings():  # Spearman keeps preds+targets: 8 bytes a row, fine for router splits
            warnings.filterwarnings("ignore", message=".*will save all targets and predictions.*")
            regression = MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError(),
                                           "spearman": SpearmanCorrCoef()})
        # One metric instance per stage (ModuleDict keys get a suffix: "train" would shadow Module.train).
        self.regression = nn.ModuleDict({f"{s}_m": regression.clone(prefix=f"{s}/") for s in STAGES})
        self.auroc = nn.ModuleDict({f"{s}_m": BinnedAUROC(thresholds=auroc_bins) for s in STAGES})
        self.routing = nn.ModuleDict({f"{s}_m": RoutingTau(self.thresholds) for s in ("val", "test")})
        #: last computed routing summary per stage (curve included), for plots and the model card.
        self.last_routing: dict[str, dict[str, Any]] = {}

    def forward(self, hidden: Tensor, context: Tensor | None = None) -> Tensor:
        return self.router(hidden, context)

    def predict_batch(self, batch: dict[str, Tensor]) -> Tensor:
        """The router's predicted gain for a batch of the data module (its context columns, if it reads any)."""
        return self.router(batch["hidden"], batch["context"][:, self.context_columns] if self.context_columns else None)

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        previous = [n for n in self.router.context if n.startswith("prev_")]
        manifest = getattr(dm, "manifest", None)
        if previous and manifest is not None and manifest.every_position:
            raise ValueError(f"--model.context {previous}: the data has a row at every position (whiflash-datagen "
                             "--path every), not rounds, so a row has no previous round; train on entropy alone")
        if stage == "fit" and dm is not None and getattr(dm, "norm_mean", None) is not None:
            # Training-split statistics; a resumed checkpoint's own buffers are restored after this hook.
            cols = self.context_columns
            # the earlier positions' states are states of the same kind: one set of statistics for each
            times = 1 + self.router.history
            self.router.set_normalization(torch.cat([dm.norm_mean.repeat(times), dm.context_mean[cols]]),
                                          torch.cat([dm.norm_std.repeat(times), dm.context_std[cols]]))

    def _loss(self, pred: Tensor, gain: Tensor) -> Tensor:
        if self.hparams.loss == "decision":  # a smooth bound on the regret sum |gain| * [wrong choice]
            choice = F.binary_cross_entropy_with_logits(pred, (gain > 0).to(pred.dtype), reduction="none")
            return (gain.abs() * choice).mean()
        if self.hparams.loss == "huber":
            return F.huber_loss(pred, gain, delta=self.hparams.huber_delta)
        return F.mse_loss(pred, gain)

    def _step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        pred = self.predict_batch(batch)
        gain = batch["gain"].float()
        loss = self._loss(pred, gain)
        n = gain.numel()
        # sync_dist: under DDP the epoch loss is the mean over ranks, not rank 0's part alone
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, batch_size=n,
                 prog_bar=stage != "test", sync_dist=True)
        p = pred.detach()
        self.regression[f"{stage}_m"].update(p, gain)
        # AUROC on the routing decision; the sigmoid only maps g_hat into the binned [0, 1] range.
        self.auroc[f"{stage}_m"].update(torch.sigmoid(p - self.hparams.auroc_threshold),
                                 (gain > self.hparams.auroc_threshold).long())
        self.log_dict(self.regression[f"{stage}_m"], on_step=False, on_epoch=True, batch_size=n)
        self.log(f"{stage}/auroc", self.auroc[f"{stage}_m"], on_step=False, on_epoch=True, batch_size=n)
        if f"{stage}_m" in self.routing:
            self.routing[f"{stage}_m"].update(p, batch["tau_0"], batch["tau_1"], batch.get("weight"))
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return {"row": batch["row"], "pred": self.predict_batch(batch), "gain": batch["gain"]}

    def _log_routing(self, stage: str) -> None:
        metric = self.routing[f"{stage}_m"]
        if float(metric.count) == 0:  # local count: under DDP every rank holds part of every batch, so all agree
            return
        s = metric.compute()  # torchmetrics sums the states over DDP ranks here
        metric.reset()
        self.last_routing[stage] = {k: v.tolist() for k, v in s.items()}
        for key in ("share", "tau_best", "best_threshold", "tau_oracle", "tau_slot0", "tau_slot1"):
            # already equal on every rank; sync_dist only tells Lightning so (its mean of equal values)
            self.log(f"{stage}/{key}", s[key], prog_bar=key == "share", sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_routing("val")

    def on_test_epoch_end(self) -> None:
        self._log_routing("test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.router.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint trained for another feature width, drafter pair or tree budget."""
        hp = dict(checkpoint.get("hyper_parameters", {}))
        if "drafters" in hp:  # checkpoints written before the argument was renamed to ``pair``
            hp.setdefault("pair", hp.pop("drafters"))
        trainer = self._trainer
        ckpt = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        dm = getattr(trainer, "datamodule", None) if trainer is not None else None
        data = f"dataset {dm.path}" if dm is not None and hasattr(dm, "path") else "this run"
        for key, what in (("hidden_size", "hidden size"), ("pair", "drafter pair"), ("tree_budget", "tree budget")):
            if key in hp and hp[key] != self.hparams[key]:
                raise ValueError(f"checkpoint {ckpt or '(given)'} was trained with {what} {hp[key]!r}, but "
                                 f"{data} has {what} {self.hparams[key]!r}; train a new router for this data "
                                 "or resume with the dataset the checkpoint was trained on")
