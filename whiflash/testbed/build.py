"""Build a testbed: corpus -> tokenizer -> tokens -> target -> responses -> EAGLE-3 -> DFlash -> acceptance.

Output layout (``OUT/``)::

    manifest.json        config, versions, per-stage fingerprints/figures, build log
    corpus/              {train,validation,test}.jsonl
    tokenizer/           tokenizer.json, tokenizer_config.json
    tokens/              {split}.{category}.npy token streams
    target/              config.json, model.safetensors, tokenizer files (Qwen3 save_pretrained)
    responses/           target-generated continuations + target features for drafter training
    eagle3/              config.json, model.safetensors (SpecForge/EAGLE-3 layout)
    dflash/              config.json, model.safetensors (z-lab DFlash layout)
    acceptance/          acceptance.jsonl: per-prompt tau of EAGLE-3, DFlash, DDTree and the oracle

Every stage is resumable (see ``manifest``): re-running a build reuses finished stages.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch

from whiflash.locks import owning_folders

from .manifest import FORMAT_VERSION, Manifest, fingerprint
from .presets import CATEGORIES, TestbedConfig, resolve_precision
from .spawning import spawnable_main

__all__ = ["build", "default_dir", "STAGES", "DRAFTER_TRAINING_VERSION"]

log = logging.getLogger(__name__)

DRAFTER_TRAINING_VERSION = 3
"""Part of the drafter stages' fingerprints: bump it when a code change makes the same config train other
weights (3: target features computed batch by batch with the build's precision), so a resumed build
retrains its drafters instead of keeping ones the code would not make now."""

STAGES: tuple[str, ...] = ("corpus", "tokenizer", "tokens", "target", "responses", "eagle3", "dflash", "acceptance")
"""Stage names in build order (also their folder names)."""


def default_dir(preset: str) -> Path:
    """Where a preset is built when no folder is given: ``$WHIFLASH_TESTBED_DIR/<preset>``,
    else ``~/.cache/whiflash/testbed/<preset>`` (a cache: builds are resumable and reusable)."""
    from whiflash.settings import testbed_dir

    root = testbed_dir() or Path.home() / ".cache" / "whiflash" / "testbed"
    return Path(root) / preset


def build(out: str | Path, config: TestbedConfig, until: str | None = None) -> dict[str, Any]:
    """Build (or resume) the testbed described by ``config`` in ``out``; return the manifest dict.

    ``until`` stops after the named stage (e.g. ``"target"`` when only the target is needed).
    """
    if until is not None and until not in STAGES:
        raise ValueError(f"until={until!r}: expected one of {', '.join(STAGES)}")
    _check(config)
    out = Path(out)
    config = resolve_precision(config)
    threads = torch.get_num_threads()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    try:
        with owning_folders():  # the folder's lock ends with the build; a refused build leaves no folder
            return _build(out, config, until)
    finally:
        torch.set_num_threads(threads)  # the caller's process keeps its own setting


def _build(out: Path, config: TestbedConfig, until: str | None) -> dict[str, Any]:
    man = Manifest(out, config.to_dict())
    man.data["preset"] = config.name
    t_start = time.perf_counter()
    last = STAGES.index(until) if until else len(STAGES) - 1
    # Each stage's fingerprint = its config + the output hashes of what it reads (see manifest.py).
    sha: dict[str, str] = {}
    dev: dict[str, Any] = {"device": config.device, "precision": config.precision}
    # compiled layers in the target stage only (when on: builds without them keep their fingerprints)
    target_dev = {**dev, "compile_layers": True} if config.compile_layers else dev
    # On the CPU the thread count sets the order of float reductions, so what a training stage writes
    # depends on it: part of those stages' fingerprints (GPU builds' fingerprints are unchanged).
    cpu = (f"threads={torch.get_num_threads()}",) if config.device == "cpu" else ()

    def run(name: str, parts: tuple, fn) -> dict[str, Any] | None:
        if STAGES.index(name) > last:
            return None
        rec = man.run_stage(name, fingerprint(FORMAT_VERSION, name, *parts), fn)
        sha[name] = rec["output_sha256"]
        return rec

    from . import corpus as corpus_mod

    rec = run("corpus", (config.corpus, corpus_mod.stdlib_root().as_posix(), corpus_mod.GENERATOR_VERSION),
              lambda d: corpus_mod.write_corpus(config.corpus, d, workers=torch.get_num_threads()))
    man.data["corpus_sha256"] = rec["sha256"]

    from .tokenizer import load_tokenizer, train_tokenizer

    tok_info = run("tokenizer", (config.tokenizer, config.corpus.seed, sha["corpus"]),
                   lambda d: train_tokenizer(out / "corpus", config.tokenizer, d, seed=config.corpus.seed))
    if tok_info is None:
        return _finish(man, t_start)
    tokenizer = load_tokenizer(out / "tokenizer")

    from .data import tokenize_corpus

    run("tokens", (sha["tokenizer"], sha["corpus"]), lambda d: tokenize_corpus(out / "corpus", tokenizer, d))

    def _target(d: Path) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        from .target import evaluate_target, train_target

        tc = config.target
        figures = train_target(tc, tok_info, out / "tokens", tokenizer, d, **target_dev)
        if tc.sharpen.steps:
            from .sharpen import sharpen_target

            model = AutoModelForCausalLM.from_pretrained(str(d)).to(config.device)
            figures["pretrained_test"] = evaluate_target(model, out / "tokens", tc.seq_len, tc.eval_windows)
            del model
            figures["sharpen"] = sharpen_target(d, out, tc.sharpen, tc.mix, tc.seq_len, tc.seed, **dev)
        model = AutoModelForCausalLM.from_pretrained(str(d)).to(config.device)
        figures["test"] = evaluate_target(model, out / "tokens", tc.seq_len, tc.eval_windows)
        return figures

    if run("target", (config.target, target_dev, *cpu, sha.get("tokens"), sha["tokenizer"], sha["corpus"]), _target) is None:
        return _finish(man, t_start)

    from whiflash.runtime.model import TAP_CONVENTION

    from .dflash_train import train_dflash
    from .drafter_data import generate_responses
    from .eagle3_train import train_eagle3

    seed = config.target.seed
    if run("responses", (config.responses, config.corpus.seed, sha["target"]),
           lambda d: generate_responses(out, config.responses, d, device=config.device,
                                        seed=config.corpus.seed)) is None:
        return _finish(man, t_start)
    drafter_code = (TAP_CONVENTION, DRAFTER_TRAINING_VERSION)
    parts = {name: (getattr(config, name), dev, *cpu, sha["responses"], sha["target"], *drafter_code)
             for name in ("eagle3", "dflash")}
    dflash_here = lambda d: train_dflash(out, config.dflash, d, seed=seed, **dev)  # noqa: E731
    child = None
    if (config.concurrent_drafters and _cores_hold_two(config.device) and last >= STAGES.index("dflash")
            and not any(man.is_done(name, fingerprint(FORMAT_VERSION, name, *p)) for name, p in parts.items())):
        child = _start_dflash(out, config, seed, dev)
    try:
        run("eagle3", parts["eagle3"], lambda d: train_eagle3(out, config.eagle3, d, seed=seed, **dev))
        run("dflash", parts["dflash"], dflash_here if child is None else
            lambda d: _join_dflash(child, d, lambda: dflash_here(d)))
    finally:
        if child is not None and child[0].is_alive():  # eagle3 failed: the DFlash child goes with the build
            child[0].terminate()
            child[0].join()

    from .acceptance import measure_acceptance

    acc = config.acceptance
    rec = run("acceptance", (acc, sha["target"], sha.get("eagle3"), sha.get("dflash"), config.eagle3.ttt_length),
              lambda d: measure_acceptance(out, d, acc.prompts_per_category, acc.max_new_tokens, device=config.device,
                                           cuda_graphs=acc.cuda_graphs, eagle3_steps=config.eagle3.ttt_length))
    if rec is not None:
        man.data["acceptance"] = {"tau": rec["tau"], "oracle_headroom": rec.get("oracle_headroom"),
                                  "switching": rec.get("switching"), "training_curve": rec.get("training_curve"),
                                  "tau_definition": rec["tau_definition"]}
    return _finish(man, t_start)


def _check(config: TestbedConfig) -> None:
    """Refuse, naming the field, the options that would otherwise fail only after hours of training."""
    from .corpus import SPLITS, check_shares
    from .drafter_data import check_mix

    check_shares(config.corpus)
    for name, source in (("target.sharpen", config.target.sharpen), ("responses", config.responses)):
        split = source.split
        named = split if isinstance(split, dict) else {"every category": split}
        if set(named) - {*CATEGORIES, "every category"} or any(s not in SPLITS[:2] for s in named.values()):
            raise ValueError(f"{name}.split={split!r}: expected 'train' or 'validation', or a mapping of categories "
                             f"({', '.join(CATEGORIES)}) to them (the test split is held out for evaluation)")
        counts = source.prompts_per_category
        if not (_count(counts) or isinstance(counts, dict) and set(counts) == set(CATEGORIES)
                and all(map(_count, counts.values()))):
            raise ValueError(f"{name}.prompts_per_category={counts!r}: expected a count >= 1, or a mapping of every "
                             f"category ({', '.join(CATEGORIES)}) to one")
    check_mix(config.eagle3.mix, "eagle3.mix")
    check_mix(config.dflash.mix, "dflash.mix")


def _count(n: object) -> bool:
    """Whether ``n`` is a count of prompts (an int >= 1)."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def _cores_hold_two(device: str) -> bool:
    """Whether two trainings can run at once here without thrashing: on a GPU (whether they gain there is the
    preset's call: `small`'s do not), or on a CPU whose cores hold both stages' threads (two OpenMP pools on too
    few cores thrash)."""
    return device != "cpu" or 2 * torch.get_num_threads() <= (os.cpu_count() or 1)


def _start_dflash(out: Path, config: TestbedConfig, seed: int, dev: dict[str, Any]) -> tuple[BaseProcess, Path]:
    """Start the DFlash stage's training in a child process, into ``OUT/.concurrent-dflash``."""
    folder = out / ".concurrent-dflash"
    if folder.exists():
        shutil.rmtree(folder)  # leftovers of a killed build
    folder.mkdir()
    proc = spawn_child(_train_dflash_child, (str(out), asdict(config.dflash), str(folder), seed, dev,
                                             torch.get_num_threads()), name="dflash-stage")
    log.info("stage dflash    training in a child process (pid %s) beside eagle3", proc.pid)
    return proc, folder


def spawn_child(target: Callable[..., Any], args: tuple[Any, ...], name: str) -> BaseProcess:
    """Start `target(*args)` in a spawned daemon process (it ends with the build), whatever ran the build
    (`spawnable_main`: a build from a script on stdin would otherwise lose the child, and the stage would train
    again after eagle3 instead of beside it)."""
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, name=name, daemon=True)
    with spawnable_main():
        proc.start()
    return proc


def _train_dflash_child(out: str, dflash: dict[str, Any], folder: str, seed: int, dev: dict[str, Any],
                        threads: int) -> None:
    """The child's DFlash training, as the build runs it (same threads, seed and precision); its figures go beside
    the checkpoint folder, not into it, so the stage's output hash is that of the training alone."""
    from .dflash_train import train_dflash
    from .presets import DFlashConfig

    exit_with_parent(os.getppid())
    torch.set_num_threads(threads)  # CPU reductions follow the thread count: the build's, not the child's default
    stage = Path(folder) / "stage"
    stage.mkdir()
    figures = train_dflash(Path(out), DFlashConfig(**dflash), stage, seed=seed, **dev)
    (Path(folder) / "figures.json").write_text(json.dumps(figures))


def exit_with_parent(parent: int, every: float = 1.0) -> threading.Thread:
    """End this process when `parent` is no longer its parent. A build stopped by a signal (a device command's time
    limit) runs no exit handlers, so its daemon child would train on, orphaned, beside the next build's."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


def _join_dflash(child: tuple[BaseProcess, Path], d: Path, retrain: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The DFlash stage's ``fn``: wait for the child, move its checkpoint into the stage folder ``d`` and return its
    figures; when the child failed, train here after all (``retrain``), so a build never ends on it."""
    proc, folder = child
    proc.join()
    if proc.exitcode != 0 or not (folder / "figures.json").is_file():
        log.warning("stage dflash    child process ended with exit code %s: training it here instead", proc.exitcode)
        shutil.rmtree(folder, ignore_errors=True)
        return retrain()
    for item in (folder / "stage").iterdir():
        os.replace(item, d / item.name)
    figures = json.loads((folder / "figures.json").read_text())
    shutil.rmtree(folder)
    return {**figures, "concurrent_with": "eagle3"}


def _finish(man: Manifest, t_start: float) -> dict[str, Any]:
    stages = man.data["stages"]
    man.data["sizes"] = {name: _dir_bytes(man.root / name) for name in STAGES if (man.root / name).is_dir()}
    man.data["last_run_seconds"] = round(time.perf_counter() - t_start, 1)
    man.data["build_seconds"] = round(sum(s.get("seconds", 0.0) for s in stages.values()), 1)
    man.save()
    return man.data


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
