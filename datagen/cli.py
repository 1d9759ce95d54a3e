"""whiflash-datagen: log per-round router data (features + both drafters' tau) as a router dataset
(docs/design.md, "The router dataset").

Example (the embedded testbed; a real run names Hub ids or folders instead):

    whiflash-datagen --testbed runs/testbed/tiny --prompts testbed:validation --out data/tiny-df-e3

On several GPUs, the same command under torchrun (docs/multi_gpu.md): each rank decodes every N-th shard
on cuda:LOCAL_RANK, and the dataset is the one a single process writes, file for file:

    torchrun --nproc-per-node 2 -m whiflash.datagen --testbed runs/testbed/tiny --prompts testbed:validation ...
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import whiflash
from whiflash import distributed, session
from whiflash.data import (ADVANCE_RULE, EVERY_POSITION, RouterDatasetManifest, ShardEntry, shard_entry, write_manifest,
                           write_shard)
from whiflash.datagen.parallel import continuations, record_prompt_parallel
from whiflash.datagen.prompts import PromptItem, parse_sources, prompts_sha256, read_source, resolve_source
from whiflash.datagen.record import record_prompt
from whiflash.decoding import prompt_room
from whiflash.decoding.routed import OracleDrafter
from whiflash.engine import describe, engine_defaults, engine_options
from whiflash.errors import UsageError, run_cli
from whiflash.flags import dashed_argv, dashed_help, kebab
from whiflash.folders import DATAGEN, DATAGEN_RECORD, TESTBED, check_folder, require_kind
from whiflash.hub import local_or_hub
from whiflash.io import atomic_write_json, checkpoint_stamp
from whiflash.locks import claim, owning_folders
from whiflash.pairs import Pair
from whiflash.records import UniqueIds
from whiflash.runtime.weights import read_json
from whiflash.session import Session
from whiflash.versions import package_versions

log = logging.getLogger("whiflash.datagen")


DTYPES = ("float32", "bfloat16", "float16")


def _check_arguments(args: dict, pair: Pair) -> None:
    """Refuse unusable arguments before anything is pinned or loaded, naming the flag."""
    for flag in ("num_steps", "per_category", "max_prompt_tokens", "max_new_tokens", "shard_size"):
        value = args[flag]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{kebab(flag)}: expected an integer >= 1, got {value!r}")
    if args["max_prompts"] is not None and (not isinstance(args["max_prompts"], int) or args["max_prompts"] < 1):
        raise ValueError(f"--max-prompts: expected an integer >= 1 (or none), got {args['max_prompts']!r}")
    if args["dtype"] not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {args['dtype']!r}")
    if args["eagle3"] is not None and not pair.needs_eagle3:
        raise ValueError(f"--eagle3 {args['eagle3']}: --pair {pair} has no EAGLE-3 slot")
    budget = args["tree_budget"]
    if budget is not None and not pair.uses_tree:
        raise ValueError(f"--tree-budget {budget}: --pair {pair} has no DDTree slot")
    if budget is not None and (not isinstance(budget, int) or budget < 1):
        raise ValueError(f"--tree-budget: expected an integer >= 1, got {budget!r}")
    if args["path"] not in PATHS:
        raise ValueError(f"--path: expected one of {', '.join(PATHS)}, got {args['path']!r}")
    if (args["path"] == "router") != (args["router"] is not None):
        raise ValueError("--path router and --router go together: the router's decisions are the path "
                         f"(got --path {args['path']}, --router {args['router']})")
    if args["router_thresholds"] is not None and args["router"] is None:
        raise ValueError(f"--router-thresholds {args['router_thresholds']}: needs --path router --router")
    if args.get("parallel") and args["path"] == "router":
        raise ValueError("--parallel: walks the --path oracle, slot0, slot1, mixed or every over taus it computes "
                         "first; --path router decides from each round's state as it decodes: drop --parallel")
    if args["path"] == "every" and not args.get("parallel"):
        raise ValueError("--path every: needs --parallel (a decode takes one path; the passes give every position)")


PATHS = {
    "oracle": ADVANCE_RULE,
    "slot0": "slot 0 advances every round (its own path); both slots' taus measured from each state; greedy decoding",
    "slot1": "slot 1 advances every round (its own path); both slots' taus measured from each state; greedy decoding",
    "mixed": "by prompt order i: i % 3 == 0 the slot with the larger tau advances (ties: slot 1), 1 slot 0 always, "
             "2 slot 1 always; both slots' taus measured from each state; greedy decoding",
    "every": EVERY_POSITION,
    "router": "the slot the neural router (--router, at its category's threshold) picks at the round's start advances "
              "(the routed decode's own path: on-policy rows); both slots' taus measured from each state; greedy "
              "decoding",
}
"""`--path`: which slot each round advances with, as the manifest's `advance_rule` says it."""


def _follow(path: str, index: int) -> int | None:
    """The slot prompt `index` (in prompt order) advances with under `path`; None: the larger tau (or, under
    `router`, the router's pick)."""
    rule = ("oracle", "slot0", "slot1")[index % 3] if path == "mixed" else path
    return None if rule in ("oracle", "router", "every") else int(rule[-1])


@owning_folders()  # --out is this run's from its first check to its last write
def datagen(
    *,
    out: Path,
    prompts: list[str] | str,
    target: str | None = None,
    eagle3: str | None = None,
    dflash: str | None = None,
    testbed: Path | None = None,
    pair: str = "df-e3",
    tree_budget: int | None = None,
    num_steps: int = 6,
    per_category: int = 64,
    max_prompts: int | None = None,
    max_prompt_tokens: int = 1024,
    max_new_tokens: int = 128,
    shard_size: int = 16,
    device: str = "cuda" if torch.cuda.is_available() else "cpu",
    dtype: str | None = None,
    cuda_graphs: bool | None = None,
    compile_layers: bool | None = None,
    processes_per_device: int = 1,
    seed: int = 0,
    path: str = "oracle",
    router: str | None = None,
    router_thresholds: Path | None = None,
    parallel: bool = False,
) -> Path:
    """Decode prompts with both drafters from the same state each round and write one row per round.

    Args:
        out: dataset folder (Parquet shards + manifest.json), new or empty, or one this command wrote: a killed
            run resumed with the same arguments and prompts reuses finished shards; anything else is refused.
        prompts: sources, each `testbed:SPLIT`, `testbed:heldout` (per category the split the drafters did not
            learn from: router data), `testbed:dev` (test-split prompts from documents the benchmark's pool of 80
            a category does not cut) or a JSONL file (FastChat `turns`, `prompt` or `input_ids`);
            a list, or one string (several sources separated by commas).
        target: target model (Hub id or folder); default `<testbed>/target`.
        eagle3: EAGLE-3 drafter (Hub id or folder); default `<testbed>/eagle3`.
        dflash: DFlash drafter (Hub id or folder), also used for DDTree; default `<testbed>/dflash`.
        testbed: a built testbed folder, the default for the three models and `testbed:` sources.
        pair: drafter pair (`--whiflash-drafters`): df-e3, ddt-e3 or df-ddt (slot 0 first).
        tree_budget: DDTree nodes for pairs with a DDTree slot (default block_size - 1).
        num_steps: EAGLE-3 chain length.
        per_category: prompts per category taken from each `testbed:` source.
        max_prompts: cap on the number of prompts (after concatenating the sources).
        max_prompt_tokens: prompts are cut to their last this-many tokens.
        max_new_tokens: tokens generated per prompt (greedy).
        shard_size: prompts per Parquet shard (the unit of resumption).
        device: torch device. Under torchrun give the type (`cuda`): each rank takes cuda:LOCAL_RANK.
        dtype: float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 elsewhere).
        cuda_graphs: replay captured CUDA graphs for the fixed-shape passes (target verify, drafting,
            catch-up); the eager path rebuilds its work every round (default: on with CUDA, off elsewhere).
        compile_layers: with CUDA graphs, torch.compile the layer stages and drafter passes inside them
            (default: on where torch.compile runs, Triton installed; --no-compile-layers for uncompiled passes). Compiled
            kernels round differently, so a row may differ at a near-tie; resuming may switch it.
        processes_per_device: under torchrun, ranks that share one GPU (rank r decodes on cuda:LOCAL_RANK // this;
            --nproc-per-node = GPUs x this). One sequence at a time leaves a GPU idle between a round's host
            steps, so several processes on one GPU raise rows/s; the rows are the same for any launch.
        seed: recorded in the manifest (decoding is greedy and deterministic).
        path: which slot each round advances with. `oracle`: the larger tau (upstream's labels; the states
            are those of perfect routing); `slot0` / `slot1`: always that slot, so the states are the ones that
            drafter reaches on its own; `mixed`: the three in turn by prompt. Both taus are logged every round
            whatever the path. A drafter's tau on another's path is not its tau on its own (its misses come in
            runs), so a router that will follow one drafter for a while learns from states like those.
            `every` (with `--parallel`): a row at every position of the greedy sequence, not a path, so a replay
            walks any router's own path over them (advancing by the tau of the slot it takes) and training sees
            every state a decode can reach; `active` is the larger tau's slot.
            `router`: every round advances with the slot `--router` picks at the round's start, so the states are
            the ones WhiFlash-Neural decodes through, and a replay of that router on them prices what its decode
            does (a replay on other paths counts the positions those paths visited, not the router's).
        router: the neural router whose decisions `--path router` follows (Hub id, folder or .safetensors file;
            it must read at most the entropy beside the hidden state).
        router_thresholds: thresholds.json from `whiflash-eval calibrate` (the router's per-category thresholds,
            as `whiflash-eval bench --whiflash-thresholds` applies them); default: the router's exported threshold.
        parallel: instead of decoding each prompt with both drafters every round, decode its greedy continuation
            once (the DFlash slot alone), then compute both slots' tau at every position in a few teacher-forced
            passes and walk `--path` over them (`whiflash.datagen.parallel`). The same rows (equal in float32; in
            bf16 a near-tie may differ) from a few large passes instead of many small rounds. Any pair; a DDTree
            slot builds its tree at each position in turn.
    """
    out = Path(out)
    # what the rows depend on (the execution mode does not count: graphs and eager record the same rows)
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in locals().items()
            if k not in ("out", "cuda_graphs", "compile_layers", "processes_per_device")}
    if not parallel:  # a run pinned before --parallel existed resumes as it was
        del args["parallel"]
    engine = engine_defaults(device, dtype, cuda_graphs, compile_layers)  # bf16 and compiled layers on CUDA
    args["dtype"] = dtype = engine["dtype"]
    parsed = Pair.parse(pair, what="--pair")
    _check_arguments(args, parsed)
    if isinstance(processes_per_device, bool) or not isinstance(processes_per_device, int) or processes_per_device < 1:
        raise ValueError(f"--processes-per-device: expected an integer >= 1, got {processes_per_device!r}")
    # everything is checked and read before anything is written: a refused call leaves --out as it was
    check_folder(out, DATAGEN, "--out")
    if distributed.from_env().is_main:  # one lock per launch: rank 0 writes the record and the manifest
        claim(out, "--out")
    resuming = check_folder(out, DATAGEN, "--out")  # again, now that no other run can change it
    if testbed is not None:
        require_kind(testbed, TESTBED, "--testbed")
    paths = _model_paths(parsed, testbed, target=target, eagle3=eagle3, dflash=dflash)
    resolved = {k: _resolved(v, f"--{k}") for k, v in paths.items()}  # a missing folder is named now
    sources = parse_sources(prompts)
    items = [it for src in sources for it in read_source(src, testbed, per_category)][:max_prompts]
    ids = UniqueIds()  # each file refuses its own repeats by line; here a source listed twice
    for it in items:
        ids.add(it.prompt_id, it.source)
    ranks = distributed.init()
    # pinned arguments keep the user's `cuda`; this rank decodes on cuda:LOCAL_RANK // processes_per_device
    device = ranks.device(device, per_device=processes_per_device)
    if not items:
        raise ValueError(f"--prompts {sources} gave no prompts")
    # --path router: the rows depend on the router's weights and its thresholds, pinned like the checkpoints
    router_pin: dict[str, Any] = {}
    if router is not None:
        router_pin = {"router": _resolved(router, "--router")}
        router_pin["router_files"] = checkpoint_stamp(router_pin["router"])
    if router_thresholds is not None:
        try:
            blob = Path(router_thresholds).read_bytes()
        except OSError as err:
            raise ValueError(f"--router-thresholds {router_thresholds}: cannot read ({err}); expected a thresholds.json "
                             "from whiflash-eval calibrate") from None
        router_pin |= {"router_thresholds": str(Path(router_thresholds).resolve()),
                       "router_thresholds_sha256": hashlib.sha256(blob).hexdigest()}
    # the record holds resolved paths, not spellings, and the prompts' content, not only where they came from
    record = {**args, **router_pin, "kind": DATAGEN, **resolved, "prompts_sha256": prompts_sha256(items),
              **{f"{k}_files": checkpoint_stamp(v) for k, v in resolved.items()},
              "testbed": str(Path(testbed).resolve()) if testbed else None,
              "prompts": [resolve_source(s) for s in sources]}
    if resuming:  # a resume with other arguments or inputs is refused before any model is loaded
        _pin(out / DATAGEN_RECORD, resuming, record)

    # the engine the flags resolve to (`whiflash.engine`); the drafters take the target's options when they attach
    run = Session.open(paths, str(device), dtype,
                       engine_options(str(device), engine["cuda_graphs"], engine["compile_layers"]))
    model = run.target
    # the DFlash checkpoint fills the parallel slot, drafting a tree when the pair has a DDTree slot
    slots = {"dflash": (whiflash.load_drafter("ddtree", paths["dflash"], model, tree_budget=tree_budget) if parsed.uses_tree
                        else whiflash.load_drafter("dflash", paths["dflash"], model))}
    if parsed.needs_eagle3:
        slots["eagle3"] = whiflash.load_drafter("eagle3", paths["eagle3"], model, num_steps=num_steps)
    recorder = OracleDrafter(parsed, tree_budget=tree_budget if parsed.uses_tree else None, **slots)
    policy_for = _router_policies(router, router_thresholds, model, parsed, recorder.tree_budget)
    _check_room(model, paths["target"], max_new_tokens, recorder.max_nodes)
    if not resuming:  # pinned once the target has room for the run (a resumed record already passed this)
        _pin(out / DATAGEN_RECORD, resuming, record)

    # Shards are the unit of work: under torchrun each rank claims the next free shard (`_claims`); names and
    # contents do not depend on N or on who decodes them, so the dataset equals a single process's and a killed
    # launch resumes with any N.
    done: dict[int, ShardEntry] = {}
    chunks = [items[i : i + shard_size] for i in range(0, len(items), shard_size)]
    # every prompt is drawn (they take seconds each, so redrawing costs nothing), not 10 per second at most;
    # with several ranks the share of each is known only at the end
    bar = tqdm(total=len(items) if ranks.world == 1 else None, desc=ranks.describe("datagen prompts"),
               unit="prompt", mininterval=0)
    meter = TauMeter(parsed)
    rows_of = functools.partial(record_prompt_parallel, every=path == "every") if parallel else record_prompt
    start, decoded = time.perf_counter(), 0
    for index in _claims(out, len(chunks), ranks):
        shard = out / f"shard-{index:05d}.parquet"
        if shard.exists():  # finished before a restart (shards are renamed into place only when complete)
            done[index] = shard_entry(shard)
            bar.update(len(chunks[index]))
            continue
        columns = _record_chunk(run, recorder, chunks[index], max_prompt_tokens, max_new_tokens,
                                on_prompt=lambda cols: meter.add(cols, bar),
                                follow=[_follow(path, index * shard_size + j) for j in range(len(chunks[index]))],
                                policy_for=policy_for, record=rows_of, batch=continuations if parallel else None)
        done[index] = write_shard(shard, columns, model.config.hidden_size)
        decoded += done[index].rows
    bar.close()
    seconds = time.perf_counter() - start  # per-rank throughput (scripts/multi_gpu_session.sh reads this line)
    log.info("%s: decoded %d rounds in %.2f s (%.1f rounds/s)", ranks.describe("datagen"), decoded, seconds,
             decoded / max(seconds, 1e-9))
    merged = {index: entry for part in distributed.gather(done) for index, entry in part.items()}
    shards = [merged[index] for index in range(len(chunks))]
    if ranks.is_main:  # every rank has passed its last claim (the gather waited for all): this launch's claims
        for claims in out.glob(".claims-*"):  # and those of killed launches go
            shutil.rmtree(claims, ignore_errors=True)
    if not ranks.is_main:  # rank 0 writes the manifest; every rank returns once it is there
        distributed.barrier()
        return out
    manifest = RouterDatasetManifest(
        target=paths["target"], pair=parsed, tree_budget=recorder.tree_budget,
        drafter_ids=(paths["dflash"], paths["eagle3"] if parsed.needs_eagle3 else paths["dflash"]),
        tap_layers=list(recorder.tap_layers), hidden_size=model.config.hidden_size, prompt_sets=sources,
        seed=seed, shards=shards, versions=package_versions("whiflash", "torch", "transformers"),
        advance_rule=PATHS[path],
        generator={"name": "whiflash.datagen", "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
                   "num_steps": num_steps, "prompts_sha256": record["prompts_sha256"],
                   "engine": describe(str(device), dtype, model.engine)},
    )
    write_manifest(out, manifest)
    log.info("wrote %d rounds from %d prompts to %s", manifest.num_rows, len(items), out)
    if manifest.num_rows:
        from .plots import plot_tau_pairs

        log.info("tau_0 against tau_1 per category: %s", plot_tau_pairs(out))
    distributed.barrier()
    return out


def _claims(out: Path, shards: int, ranks: distributed.Ranks) -> Iterator[int]:
    """The shard indices this rank decodes, in order. One process takes every shard. Under torchrun a rank takes
    the next shard no rank of this launch has claimed yet (a claim: a file made with ``O_EXCL`` in
    ``OUT/.claims-LAUNCH``), so a rank whose shards were quick (math, agentic: few rounds of long accepted blocks)
    goes on with more instead of idling while another still decodes a fixed share. Claims of a killed launch
    carry another launch id and are ignored; finished shards are skipped by the caller."""
    if ranks.world == 1:
        yield from range(shards)
        return
    folder = out / f".claims-{distributed.broadcast(uuid.uuid4().hex)}"
    folder.mkdir(exist_ok=True)
    for index in range(shards):
        try:
            os.close(os.open(folder / f"{index:05d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # another rank of this launch has it
            continue
        yield index


def _check_room(model, target: str, max_new_tokens: int, max_nodes: int) -> None:
    """Refuse a `--max-new-tokens` that leaves no room for a prompt in the target's positions, before the
    arguments are pinned."""
    if prompt_room(model, max_new_tokens, max_nodes) < 1:
        positions = model.config.max_position_embeddings
        raise UsageError(f"--max-new-tokens {max_new_tokens}: the target {target} has {positions} positions, and "
                         f"a round's drafts take {2 * max_nodes + 2} of them, so no prompt token fits; expected at "
                         f"most {positions - 2 * max_nodes - 3}")


def _model_paths(pair: Pair, testbed: Path | None, **given: str | None) -> dict[str, str | None]:
    """The checkpoints the pair uses, as given by a flag or else the testbed's folder; None for a slot the
    pair does not have."""
    paths = session.model_paths(testbed, **given)
    if not pair.needs_eagle3:
        paths["eagle3"] = None
    if paths["target"] is None or paths["dflash"] is None or (pair.needs_eagle3 and paths["eagle3"] is None):
        raise ValueError(f"--pair {pair} needs --testbed DIR, or --target and --dflash"
                         + (" and --eagle3" if pair.needs_eagle3 else ""))
    return paths


def _resolved(name: str | None, flag: str) -> str | None:
    """A local checkpoint by its absolute, normalised path (so its spelling does not matter on resume), a Hub
    id as is; a path that is neither fails here, before anything is pinned or downloaded."""
    found = local_or_hub(name, what=flag) if name is not None else None
    return str(found.resolve()) if isinstance(found, Path) else found


def _pin(saved: Path, resuming: bool, record: dict[str, Any]) -> None:
    """Write the run's record to `saved`, or check it against the one a resumed run pinned there; a mismatch
    names each differing field (flags as `--flag`)."""
    if not resuming:
        saved.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(saved, record, sort_keys=True)
        return
    pinned = read_json(saved, "the arguments a datagen run pinned")
    # runs pinned before checkpoint stamps existed resume on their paths alone
    record = {k: v for k, v in record.items() if k in pinned or not k.endswith("_files")}
    differ = sorted(k for k in pinned.keys() | record.keys() if pinned.get(k) != record.get(k))
    if differ:
        flags = inspect.signature(datagen).parameters
        changes = ", ".join(f"{kebab(k) if k in flags else k} {pinned.get(k)!r} -> {record.get(k)!r}" for k in differ)
        raise ValueError(f"{saved.parent} holds a datagen run with other arguments or prompts ({saved}: {changes}); "
                         "resume with the same arguments and prompts or choose another --out")


class TauMeter:
    """Mean tau per slot so far (per prompt, then over prompts: the reported tau), shown in the progress bar."""

    def __init__(self, pair: Pair) -> None:
        self.names = pair.slots
        self.sums = [0.0] * len(pair.slots)
        self.prompts = 0

    def add(self, cols: dict[str, np.ndarray], bar: tqdm) -> None:
        """Count one decoded prompt's rows (none when it ended before a round) and advance `bar` by one prompt."""
        if cols:
            self.sums = [s + float(cols[f"tau_{i}"].mean()) for i, s in enumerate(self.sums)]
            self.prompts += 1
            bar.set_postfix_str(" ".join(f"τ {n}={s / self.prompts:.2f}" for n, s in zip(self.names, self.sums)),
                                refresh=False)
        bar.update(1)


def _encode(run: Session, item: PromptItem, max_tokens: int) -> list[int]:
    """The prompt's ids, its last `max_tokens` (a long agent transcript keeps its most recent steps)."""
    if item.input_ids is not None:
        ids = list(item.input_ids)
    elif run.tokenizer is None:
        raise ValueError(f"prompt {item.prompt_id} is text, but the target has no tokenizer files")
    else:  # the chat template (thinking off) when the tokenizer has one, as whiflash-eval renders prompts
        ids = run.encode([item.text])
    return ids[-max_tokens:]


def _record_chunk(run: Session, recorder: OracleDrafter, chunk: list[PromptItem], max_prompt_tokens: int,
                  max_new_tokens: int, on_prompt: Callable[[dict[str, np.ndarray]], None],
                  follow: list[int | None], policy_for: Callable[[str], Any] | None = None,
                  record: Callable[..., dict[str, np.ndarray]] = record_prompt,
                  batch: Callable[..., list[list[int]]] | None = None) -> dict[str, np.ndarray]:
    """The rows of one shard's prompts, each advancing as `follow` says (`OracleDrafter.follow`), or as the policy
    `policy_for(category)` decides (`OracleDrafter.policy`); `on_prompt` sees each prompt's columns as it finishes
    (progress); `record` makes a prompt's rows (`record_prompt_parallel`: from parallel passes, each prompt's
    `continuation` made for the whole shard at once by `batch`). Decoding stops at the session's stop ids (the
    tokenizer's EOS and the generation config's), as in whiflash-eval."""
    model = run.target
    keep = min(max_prompt_tokens, prompt_room(model, max_new_tokens, recorder.max_nodes))
    prompts = [_encode(run, item, keep) for item in chunk]
    given: list[dict[str, list[int]]] = [{} for _ in chunk]
    if batch is not None:  # the shard's greedy sequences in one batch
        given = [{"continuation": new} for new in batch(model, recorder, prompts, max_new_tokens)]
    parts = []
    for item, slot, ids, extra in zip(chunk, follow, prompts, given):
        recorder.follow = slot
        recorder.policy = policy_for(item.category) if policy_for is not None else None
        cols = record(model, recorder, ids, max_new_tokens, run.stops or None, **extra)
        on_prompt(cols)
        if cols:
            n = len(cols["round"])
            cols["prompt_id"], cols["category"] = np.full(n, item.prompt_id), np.full(n, item.category)
            parts.append(cols)
    if not parts:
        raise ValueError(f"prompts {[i.prompt_id for i in chunk]} produced no decoding rounds")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _router_policies(router: str | None, thresholds: Path | None, model: Any, pair: Pair,
                     tree_budget: int | None) -> Callable[[str], Any] | None:
    """`--path router`: the router's policy for a prompt's category (its thresholds.json's threshold there, else its
    exported one), or None without --router. A router that reads the previous round is refused: the path's rounds
    are not a routed drafter's, so nothing reports them to it."""
    if router is None:
        return None
    from whiflash.eval.bench import read_thresholds, threshold_for
    from whiflash.routers import NeuralPolicy

    module = whiflash.load_router(router, hidden_size=model.config.hidden_size, pair=pair, tree_budget=tree_budget,
                                  device=model.device).eval()
    if any(name != "entropy" for name in module.context):
        raise ValueError(f"--router {router}: it reads {', '.join(module.context)}; --path router follows routers "
                         "that read the hidden state and at most the entropy")
    calibrated = None
    if thresholds is not None:
        calibrated = read_thresholds(str(thresholds)).get("whiflash-neural")
        if calibrated is None:
            raise ValueError(f"--router-thresholds {thresholds}: expected a thresholds.json of whiflash-neural "
                             "(whiflash-eval calibrate --calibrate-method whiflash-neural)")
    cache: dict[str, Any] = {}

    def policy_for(category: str) -> Any:
        if category not in cache:
            thr = threshold_for(calibrated, category) if calibrated is not None else None
            cache[category] = NeuralPolicy(module, thr)
        return cache[category]

    return policy_for


def flag_kinds() -> dict[str, bool]:
    """Every `datagen` parameter and whether it is a yes/no option (a ``--x`` / ``--no-x`` switch)."""
    return {name: "bool" in str(p.annotation) for name, p in inspect.signature(datagen).parameters.items()}


def main(argv: list[str] | None = None) -> None:
    """Run `whiflash-datagen` in-process, errors raised to the caller; `argv` replaces `sys.argv[1:]` (the demo
    runs it in-process). The console script is :func:`console`.

    Flags are kebab-case (``--max-new-tokens``) with yes/no options as switches (``--cuda-graphs`` /
    ``--no-cuda-graphs``), as in whiflash-eval; the old spellings (``--max_new_tokens``, ``--cuda_graphs false``)
    still run, with a deprecation warning (`whiflash.flags.dashed_argv`)."""
    import contextlib
    import io

    from jsonargparse import CLI

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")
    kinds = flag_kinds()
    args = dashed_argv(sys.argv[1:] if argv is None else argv, kinds, "whiflash-datagen")
    if not {"-h", "--help"} & set(args):
        CLI(datagen, args=args)
        return
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            CLI(datagen, args=args)
    finally:  # --help exits: print it in the kebab-case spelling
        print(dashed_help(text.getvalue(), kinds), end="")


def console(argv: list[str] | None = None) -> None:
    """The `whiflash-datagen` command: :func:`main`, ending with exit status 2 (bad usage or input) or 1 (a
    failure while running) and a one-line `error:` message; `--debug` or `WHIFLASH_DEBUG=1` adds the traceback."""
    run_cli("whiflash-datagen", main, argv)


if __name__ == "__main__":
    console()
