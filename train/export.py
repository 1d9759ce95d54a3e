"""Export the best checkpoint as a Hub-ready folder and a single ``.safetensors`` file, with a model card.

``export_run`` scores the validation split with the best router, picks the recommended threshold (the one
with the highest replayed tau; with a latency profile the one of the highest replayed tokens/s), writes
``router/{model.safetensors,config.json,README.md}``, ``router.safetensors`` and ``results.json``, and checks that both exports load strictly with
:func:`whiflash.router.load_router` and give identical outputs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import ModelCard, ModelCardData

from whiflash.hub import is_hub_id, public_name
from whiflash.io import atomic_write_json
from whiflash.router import (NeuralRouter, export_single_file, load_router, suggested_repo_name,
                             write_training_prompts)
from whiflash.router_context import context_columns

from .data import RouterDataModule
from .metrics import routing_summary
from .task import RouterTask

log = logging.getLogger(__name__)


@torch.no_grad()
def score_split(router: NeuralRouter, dm: RouterDataModule, split: str = "val") -> dict[str, np.ndarray]:
    """Predicted gains plus the logged gain/taus/category of every row of ``split``."""
    cols = context_columns(router.context)
    router.eval()
    logged = ("gain", "tau_0", "tau_1", "category", "prompt", "round", "position", "weight")
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("pred", *logged)}
    loader = dm.loader(split)
    for batch in loader:
        out["pred"].append(router(batch["hidden"], batch["context"][:, cols] if cols else None).numpy())
        for k in logged:
            out[k].append(batch[k].numpy())
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}


def evaluate_scores(scores: dict[str, np.ndarray], thresholds: list[float], categories: list[str]) -> dict[str, Any]:
    """Regression metrics, exact AUROC of ``gain > 0`` and the routing replay (overall and per category)."""
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score

    pred, gain = scores["pred"], scores["gain"]
    t = {k: torch.from_numpy(np.asarray(scores[k])) for k in ("pred", "tau_0", "tau_1", "weight")}
    routing = {k: v.tolist() for k, v in routing_summary(t["pred"], t["tau_0"], t["tau_1"], thresholds,
                                                         t["weight"]).items()}
    label = gain > 0
    res: dict[str, Any] = {
        "rows": int(len(gain)),
        "mse": float(np.mean((pred - gain) ** 2)),
        "mae": float(np.mean(np.abs(pred - gain))),
        "spearman": float(spearmanr(pred, gain).statistic) if len(gain) > 1 else float("nan"),
        "auroc": float(roc_auc_score(label, pred)) if 0 < label.sum() < len(label) else float("nan"),
        "routing": routing,
    }
    theta = routing["best_threshold"]
    per_cat = {}
    for code, name in enumerate(categories):
        m = scores["category"] == code
        if m.any():
            t0, t1, w = scores["tau_0"][m], scores["tau_1"][m], scores["weight"][m]  # w: as `routing_summary`
            pick = np.where(pred[m] > theta, t0, t1)
            per_cat[name] = {"rows": int(m.sum()), "tau_slot0": float(np.average(t0, weights=w)),
                             "tau_slot1": float(np.average(t1, weights=w)),
                             "tau_router": float(np.average(pick, weights=w)),
                             "tau_oracle": float(np.average(np.maximum(t0, t1), weights=w))}
    res["per_category"] = per_cat
    return res


def _prompt_set_name(prompt_set: Any) -> Any:
    """A prompt set as the card shows it: its ``name``, and a local file by its name only."""
    name = prompt_set.get("name", prompt_set) if isinstance(prompt_set, dict) else prompt_set
    return public_name(name) if isinstance(name, str) else name


_SCORES = {"decision": "the log-odds that slot 0 is the better choice, each training row weighted by the size of its "
                       "gain (`--model.loss decision`)"}
"""What the router's score is, by training loss (any other: the predicted gain of slot 0 over slot 1)."""
_LABELS = {"tau": "gain in acceptance length, `tau(slot 0) - tau(slot 1)`",
           "speed": "gain in tokens/s in tau units, `--data.label speed`"}


def model_card(router: NeuralRouter, dm: RouterDataModule, results: dict[str, Any], ckpt: str | None) -> ModelCard:
    """Model card: what the router was trained for, on which data (manifest hash), and how well it routes.

    Checkpoints are named by Hub id or folder name (:func:`whiflash.hub.public_name`), never by local path.
    """
    m, r = dm.manifest, results["routing"]
    data = ModelCardData(library_name="whiflash", license="apache-2.0", tags=[
        "speculative-decoding", "router", "whiflash", *sorted(set(router.pair.slots))],
        metrics=["mse", "mae", "spearmanr", "roc_auc"])
    if is_hub_id(router.target):  # link the router to its target in the Hub graph (local paths are not ids)
        data.base_model = router.target
    budget = router.tree_budget if router.tree_budget is not None else "—"
    lines = [
        f"# {suggested_repo_name(router.target, router.pair, router.tree_budget)}", "",
        "WhiFlash-Neural router: a 2-layer MLP on the target's final post-norm hidden state that scores the "
        f"choice between its two drafters: "
        f"{_SCORES.get(results['trained_for']['loss'], 'the predicted gain of slot 0 over slot 1')} "
        f"({_LABELS[results['trained_for']['label']]}); the routed loop drafts with slot 0 when "
        "`score > threshold`.", "",
        "| field | value |", "|---|---|",
        f"| target | `{public_name(router.target)}` |",
        f"| drafter pair (`--whiflash-drafters`) | `{router.pair}` (slot 0 = {public_name(m.drafter_ids[0])}, "
        f"slot 1 = {public_name(m.drafter_ids[1])}) |",
        f"| DDTree tree budget (`--ddtree-tree-budget`) | {budget} |",
        f"| hidden size / MLP width | {router.hidden_size} / {router.mlp_dim} |",
        f"| context features after the hidden state | {', '.join(router.context) or 'none'} |",
        f"| positions before the decision point whose hidden states it reads (`history`) | {router.history} |",
        f"| recommended threshold | **{router.threshold:g}** (re-calibrate per hardware and category) |",
        f"| data manifest sha256 | `{dm.manifest_sha256}` |",
        *([f"| training rows also from | {len(dm.extra_paths)} more dataset(s), manifest sha256 "
           f"{', '.join(f'`{h}`' for h in dm.extra_manifest_sha256)} |"] if dm.extra_paths else []),
        f"| data | {m.num_rows} rounds, prompt sets "
        f"{[_prompt_set_name(p) for p in m.prompt_sets]}, seed {m.seed} |",
        f"| checkpoint | `{Path(ckpt).name if ckpt else 'last weights'}` |", "",
        f"## Validation ({results['rows']} rounds, prompts disjoint from training)", "",
        f"{m.tau_definition}; taus are pooled means over rounds, replaying the logged rounds"
        f"{' (rows at every position weighed by the chance that a decode starts a round there)' if m.every_position else ''}.",
        "",
        "| metric | value |", "|---|---|",
        f"| MSE / MAE of the gain | {results['mse']:.4f} / {results['mae']:.4f} |",
        f"| Spearman / AUROC (gain > 0) | {results['spearman']:.4f} / {results['auroc']:.4f} |",
        f"| tau slot 0 only / slot 1 only | {r['tau_slot0']:.4f} / {r['tau_slot1']:.4f} |",
        f"| tau oracle | {r['tau_oracle']:.4f} |",
        f"| tau router at threshold {r['best_threshold']:g} | {r['tau_best']:.4f} |",
        f"| share of the oracle gain over the best fixed slot recovered | {r['share']:.4f} |", "",
        "| category | rounds | tau slot 0 | tau slot 1 | tau router | tau oracle |", "|---|---|---|---|---|---|",
        *[f"| {c} | {v['rows']} | {v['tau_slot0']:.3f} | {v['tau_slot1']:.3f} | {v['tau_router']:.3f} | "
          f"{v['tau_oracle']:.3f} |" for c, v in results["per_category"].items()], "",
        *_speed_lines(results.get("speed")),
        "## Usage", "", "```python", "from whiflash.router import load_router",
        f"router = load_router(\"<this repo or folder>\", pair=\"{router.pair}\""
        + (f", tree_budget={router.tree_budget})" if router.pair.uses_tree and router.tree_budget else ")"),
        "score = router(hidden_states"
        + (", context)" if router.context else ")")
        + f"  # [N, {'H' if not router.history else f'H * {1 + router.history}'}]"
        + (", [N, C]" if router.context else "") + " -> [N]"
        + "; draft with slot 0 where score > threshold", "```", "",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def _speed_lines(speed: dict[str, Any] | None) -> list[str]:
    """The model card's tokens/s table (with a latency profile only)."""
    if not speed:
        return []
    share = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731  (no oracle gain: undefined)
    o = speed["overall"]
    rows = [("all", o), *speed["per_category"].items()]
    return ["## Tokens per second (replayed with the latency profile)", "",
            f"{speed['definition']}. Router at threshold {o['threshold']:g}; the fastest threshold "
            f"{o['speed_best_threshold']:g} gets {o['speed_best_tokens_per_second']:.1f} tok/s "
            f"(share {share(o['speed_best_share_of_speed_oracle_gain'])}).", "",
            "| category | rounds | router tok/s | better standalone tok/s | speed oracle tok/s | "
            "share of the speed oracle's gain |", "|---|---|---|---|---|---|",
            *[f"| {c} | {v['rows']} | {v['router_tokens_per_second']:.1f} | {v['best_standalone_tokens_per_second']:.1f}"
              f" ({v['best_standalone']}) | {v['speed_oracle_tokens_per_second']:.1f} | "
              f"{share(v['share_of_speed_oracle_gain'])} |" for c, v in rows], ""]


def export_run(task: RouterTask, dm: RouterDataModule, run_dir: str | Path, ckpt: str | None) -> dict[str, Any]:
    """Export the checkpoint ``ckpt`` (or ``task``'s current weights) into ``run_dir``; returns the results."""
    run_dir = Path(run_dir)
    src = RouterTask.load_from_checkpoint(ckpt, map_location="cpu") if ckpt else task
    router = src.router.cpu().eval()
    scores = score_split(router, dm, "val")
    results = evaluate_scores(scores, task.thresholds, dm.categories)
    results["trained_for"] = {"label": dm.hparams.label, "loss": task.hparams.loss}
    if dm.profile is not None:  # tokens/s terms: the router against the speed oracle and the better drafter
        from whiflash.routers import decides_in_pass

        from .speed import speed_report

        # the recommended threshold is then the grid's fastest in tokens/s, not the one of the highest tau
        results["speed"] = speed_report(scores, None, task.thresholds, dm.categories,
                                        tuple(dm.manifest.pair.slots), dm.profile, dm.manifest.tree_budget,
                                        dm.manifest.every_position, decides_in_pass(router))
    # the exports are shared: name the target by Hub id or folder name, never by a local path
    threshold = results["speed"]["overall"]["threshold"] if "speed" in results else results["routing"]["best_threshold"]
    final = NeuralRouter(**{**router.config(), "threshold": threshold,
                            "target": public_name(router.target)})
    final.load_state_dict(router.state_dict(), strict=True)
    final.eval()
    folder = run_dir / "router"
    final.save_pretrained(folder, config=final.config())
    model_card(final, dm, results, ckpt).save(folder / "README.md")
    single = export_single_file(final, run_dir / "router.safetensors")
    for where in (folder, run_dir):  # beside both exports: a replay leaves the rows the router learned from out
        write_training_prompts(where, dm.split_prompts["train"], dm.manifest_sha256)
    # Both exports must load strictly and agree with the in-memory router bit for bit.
    rows = dm.split_indices["val"][:256]
    probe = torch.from_numpy(dm.data.inputs(rows))  # split indices are sorted
    context = torch.from_numpy(dm.data.scalars["context"][rows][:, context_columns(final.context)])
    with torch.no_grad():
        ref = final(probe, context)
        for path in (folder, single):
            out = load_router(path, hidden_size=final.hidden_size, pair=final.pair)(probe, context)
            if not torch.equal(out, ref):
                raise RuntimeError(f"exported router {path} does not reproduce the trained router's outputs")
    results.update(checkpoint=ckpt, router_dir=str(folder), router_file=str(single),
                   manifest_sha256=dm.manifest_sha256, config=final.config(),
                   suggested_repo_name=suggested_repo_name(final.target, final.pair, final.tree_budget))
    atomic_write_json(run_dir / "results.json", results)
    log.info("exported router to %s and %s (val share %.3f at threshold %g)", folder, single,
             results["routing"]["share"], final.threshold)
    results["_scores"] = scores
    return results
