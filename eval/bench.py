"""`whiflash-eval bench`: build methods from flags, run them side by side on the same prompts, compare
with AR and aggregate.

See `whiflash.eval.metrics.PROTOCOL` for the measurement protocol and docs/eval.md for the layout of
a run folder. Under `torchrun --nproc-per-node N` each rank benches every N-th sample on cuda:LOCAL_RANK
(AR and every method on the same GPU, so speedups stay paired) and rank 0 writes the results
(docs/multi_gpu.md).
"""
from __future__ import annotations

import gc
import json
import logging
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import whiflash
from whiflash import distributed
from whiflash.decoding import prompt_room
from whiflash.decoding.stats import TAU_DEFINITION
from whiflash.engine import describe, engine_options, resolve_engine
from whiflash.inputs import samples_sha256
from whiflash.io import atomic_write_text, checkpoint_stamp
from whiflash.locks import owning_folders
from whiflash.session import Session

from .benchmarks import TESTBED_CATEGORY
from .checks import check_bench_config, tau_rule
from .config import BenchConfig
from .datasets import Sample, load_selection
from .decisions import DECISIONS_DEFINITION, shared_state_decisions
from .families import parse_values
from .lossless import MarginProbe, Mismatch, first_difference
from .methods import Method, MethodFactory, method_names, model_paths
from .metrics import PROTOCOL, aggregate, decode_tokens, one_off_text
from .outputs import (SampleLog, check_output_file, device_info, prepare_run_dir, write_manifest, write_results,
                      write_save_path)

log = logging.getLogger(__name__)

__all__ = ["BenchResult", "Runner", "run_bench", "run_turn"]


@dataclass
class BenchResult:
    """What a bench run produced: its folder, aggregated results and lossless mismatches."""

    run_dir: Path
    results: dict[str, Any]
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int = 0


class Runner:
    """Loaded target, tokenizer and methods of one configuration; decodes samples side by side."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg = resolve_engine(cfg)
        if cfg.block_size is not None and cfg.block_size < 2:
            raise ValueError(f"--block-size: expected an integer >= 2 (the pending token and at least one drafted "
                             f"token), got {cfg.block_size}")
        if cfg.flash_attn:
            log.info("--flash-attn: accepted for upstream commands; this engine attends with its own kernels "
                     "(nothing changes, DDTree runs as usual)")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        testbed = Path(cfg.testbed) if cfg.testbed else None
        self.paths = model_paths(cfg.speculative_algorithm, cfg.model_name_or_path, cfg.draft_name_or_path,
                                 cfg.whiflash_eagle_draft, testbed)
        if self.paths["target"] is None:
            raise ValueError("give --model-name-or-path (Hub id or folder) or --testbed DIR")
        self.names = method_names(cfg.speculative_algorithm, cfg.methods, cfg.whiflash_router,
                                  parse_values(cfg.tree_budget, "--tree-budget", int))
        # the target owns the engine options; every method's drafter takes them when it attaches
        self.session = Session.open(self.paths, cfg.device, cfg.dtype,
                                    engine_options(cfg.device, cfg.cuda_graphs, cfg.compile_layers))
        self.target, self.tokenizer, self.stops = self.session.target, self.session.tokenizer, self.session.stops
        self.factory = MethodFactory(
            self.target, self.paths, pair=cfg.whiflash_drafters, tree_budget=cfg.ddtree_tree_budget,
            block_size=cfg.block_size, eagle_num_steps=cfg.eagle_num_steps, router=cfg.whiflash_router,
            entropy_threshold=cfg.whiflash_entropy_threshold, neural_router_path=cfg.whiflash_neural_router_path,
            neural_threshold=cfg.whiflash_neural_router_threshold, lazy_catchup=not cfg.whiflash_no_lazy_catchup,
            time_catchup=cfg.whiflash_time_catchup, latency_profile=cfg.whiflash_latency_profile,
            stick_tau=cfg.whiflash_stick_tau, tau_rule=tau_rule(cfg))
        self.thresholds = read_thresholds(cfg.whiflash_thresholds) if cfg.whiflash_thresholds else {}
        self._methods: dict[tuple[str, float | None], Method] = {}
        # category -> the methods its samples run (calibrate's per-category grid); unset: every method
        self.only: dict[str, list[str]] = {}
        self.graphs = self.target.engine.cuda_graphs

    def method(self, name: str, category: str | None = None) -> Method:
        """Method `name`, with the calibrated threshold of `category` when thresholds were given for it."""
        thr = threshold_for(self.thresholds[name], category) if name in self.thresholds else None
        key = (name, thr)
        if key not in self._methods:
            self._methods[key] = self.factory.build(name, thr)
        return self._methods[key]

    def names_for(self, category: str) -> list[str]:
        """The methods a sample of `category` runs: `only[category]` when set, else every method."""
        return self.only.get(category, self.names)

    def add_method(self, method: Method) -> None:
        """Register an extra method under its own name (calibration: one per swept threshold) and run it."""
        self._methods[(method.name, None)] = method
        if method.name not in self.names:
            self.names.append(method.name)

    def encode(self, sample: Sample, turn: int, replies: list[str]) -> list[int]:
        """Prompt ids of `turn` (0-based) with AR's earlier `replies` as history."""
        if sample.input_ids is not None:
            ids = list(sample.input_ids)
        elif self.tokenizer is None:
            raise ValueError(f"sample {sample.id} is text, but the target {self.paths['target']} has no tokenizer")
        else:  # as datagen encodes: the chat template when the tokenizer has one (a testbed's has none: raw text)
            ids = self.session.encode(sample.turns[: turn + 1], replies[:turn], enable_thinking=self.cfg.enable_thinking)
        limit = prompt_room(self.target, self.cfg.max_new_tokens, self.max_nodes())
        keep = min(limit, self.cfg.max_prompt_tokens or limit)
        if keep < 1:
            raise ValueError(f"--max-new-tokens {self.cfg.max_new_tokens} leaves no room for a prompt in the target's "
                             f"{self.target.config.max_position_embeddings} positions")
        return ids[-keep:]

    def max_nodes(self) -> int:
        return max((m.drafter.max_nodes for m in self._methods.values() if m.drafter is not None), default=0)

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def generate(self, method: Method, ids: list[int], max_new_tokens: int | None = None) -> tuple[list[int], Any]:
        """One decode with Python's garbage collector off (as `timeit` times): a collection that the allocations
        of the methods before made due would otherwise land inside this timing; it runs between decodes instead."""
        gc.disable()
        try:
            return whiflash.generate(self.target, method.drafter, ids, max_new_tokens or self.cfg.max_new_tokens,
                                     temperature=self.cfg.temperature, stop_token_ids=self.stops, seed=self.cfg.seed)
        finally:
            gc.enable()

    def one_off_now(self) -> dict[str, int]:
        """Counts of the work a timed decode should never do, so far: CUDA graphs captured, passes compiled and,
        on CUDA, memory segments the caching allocator reserved (cudaMalloc calls; a long context's first
        buffers). A timing outlier with none of them paid a host stall."""
        from whiflash.runtime.graphs import one_off_work

        now = one_off_work()
        if self.target.device.type == "cuda":
            now["segments_reserved"] = int(torch.cuda.memory_stats(self.target.device).get("segment.all.allocated", 0))
        return now

    def build_all(self, samples: list[Sample]) -> None:
        """Load every drafter and router the samples need (incompatible checkpoints fail here)."""
        for s in samples:
            for n in self.names_for(s.category):
                self.method(n, s.category)

    def prepare(self, samples: list[Sample]) -> int:
        """Build every method, size the target cache for the longest sample and warm every method up."""
        self.build_all(samples)
        longest, longest_ids = 0, None
        new = self.cfg.max_new_tokens
        for s in samples:
            first = self.encode(s, 0, [])
            # turn t's prompt holds t earlier replies of at most max_new_tokens each, then generates max_new_tokens
            need = max(len(self.encode(s, t, ["x"] * t)) + t * new + new for t in range(s.n_turns))
            if need > longest:
                longest, longest_ids = need, first
        max_len = min(longest + self.max_nodes() + 2, self.target.config.max_position_embeddings + self.max_nodes() + 2)
        self.target.setup_cache(max_len)
        warm = min(self.cfg.warmup_tokens, self.cfg.max_new_tokens)
        # A routed method may route its whole warm-up to one slot; the other's graphs (its drafting, the long
        # catch-up after a switch, the target's verify at its width with this policy deciding inside it, keyed
        # by the policy and its threshold) would then be captured inside a timed sample (+0.5 s once), so a
        # routed method is also warmed up with each slot forced; with `stick_tau`, once more with slot 0 kept
        # every round (its verify decides nothing: a graph of its own, which the warm-up's slot-0 rounds reach only
        # if they accept `stick_tau` tokens; DFlash on chat prompts seldom does, and a capture costs ~0.1 s).
        runs: list[tuple[Method, int | None, bool]] = [(m, None, False) for m in self._methods.values()]
        for m in self._methods.values():
            if isinstance(m.drafter, whiflash.RoutedDrafter):
                runs += [(m, 0, False), (m, 1, False)] + ([(m, 0, True)] if m.drafter.stick_tau is not None else [])
        for m, slot, stick in tqdm(runs if warm else [], desc="warm-up", leave=False):
            if slot is not None:
                m.drafter.force_slot, m.drafter.force_stick = slot, stick
            try:
                self.generate(m, longest_ids or [0], warm)
            finally:
                if slot is not None:
                    m.drafter.force_slot, m.drafter.force_stick = None, False
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)
        return max_len


def threshold_for(calibrated: dict[str, Any], category: str | None) -> float | None:
    """A thresholds.json's threshold for `category`: its own, else that of the testbed category a benchmark
    category stands for (`TESTBED_CATEGORY`: chat -> prose, coding -> code), else the file's `default`."""
    per = calibrated["thresholds"]
    for cat in (category, TESTBED_CATEGORY.get(category or "")):
        if cat in per:
            return per[cat]
    return calibrated.get("default")


def read_thresholds(paths: str, flag: str = "--whiflash-thresholds") -> dict[str, dict[str, Any]]:
    """The thresholds.json files from `whiflash-eval calibrate` ({"method", "thresholds": {category: value}, ...}),
    comma-separated, one per routed method, by method; errors name `flag`."""
    out: dict[str, dict[str, Any]] = {}
    for path in [p for p in paths.split(",") if p.strip()]:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{flag} {path}: cannot read ({err})") from None
        method = data.get("method") if isinstance(data, dict) else None
        if method not in ("whiflash-entropy", "whiflash-neural") or not isinstance(data.get("thresholds"), dict):
            raise ValueError(f"{flag} {path}: expected keys 'method' (whiflash-entropy|whiflash-neural) "
                             "and 'thresholds' ({category: threshold})")
        if method in out:
            raise ValueError(f"{flag}: two files for {method} ({out[method]['_path']} and {path}); "
                             "give one per routed method")
        out[method] = {**data, "_path": path}
    return out


def _row(sample: Sample, turn: int, method: Method, order: int, ids: list[int], out: list[int], st: Any,
         threshold: Any, timed: bool) -> dict[str, Any]:
    return {
        "sample": sample.id, "category": sample.category, "subcategory": sample.subcategory, "dataset": sample.dataset,
        "row": sample.row, "turn": turn,
        "method": method.name, "label": method.label, "order": order, "prompt_tokens": len(ids),
        "new_tokens": st.new_tokens, "prefill_seconds": st.prefill_seconds, "decode_seconds": st.decode_seconds,
        # a pinned routed method drafts every round with its one slot's drafter
        "taus": list(st.taus), "mean_tau": st.mean_tau, "backlogs": list(st.backlogs),
        "slots": list(st.slots) if method.pinned is None else [method.pinned] * len(st.taus),
        "switch_rate": st.switch_rate if st.slots else (0.0 if method.pinned is not None else None),
        "catchup_seconds": st.catchup_seconds, "catchup_timed": bool(timed and method.routed), "threshold": threshold,
        "slot_methods": list(method.slot_methods) if method.slot_methods else None,
        "tokens": out,
    }


@owning_folders()  # the run folder is this run's while it writes; a refused run leaves none behind
def run_bench(cfg: BenchConfig, argv: list[str] | None = None, config_dump: str | None = None) -> BenchResult:
    """Run the benchmark described by `cfg`; write (or resume) its run folder and return the results.
    Under torchrun every rank returns once rank 0 has written them; only rank 0's result holds them."""
    check_bench_config(cfg)
    if cfg.temperature > 0:
        log.warning("temperature %.3g: outputs are samples, so the token-for-token lossless check is skipped",
                    cfg.temperature)
    cfg = resolve_engine(cfg)
    check_output_file(cfg.save_path, "--save-path")
    testbed = Path(cfg.testbed) if cfg.testbed else None
    samples, selection = load_selection(cfg.dataset, testbed=testbed, max_samples=cfg.max_samples, seed=cfg.seed)
    ranks = distributed.init()
    if len(samples) < ranks.world:
        raise ValueError(f"--max-samples/--dataset give {len(samples)} sample(s) for WORLD_SIZE={ranks.world} ranks; "
                         "expected at least one sample per rank")
    runner = Runner(replace(cfg, device=ranks.device(cfg.device)))
    runner.build_all(samples)  # before the run folder exists: a refused checkpoint leaves nothing behind
    hardware = check_devices(distributed.gather(device_info(runner.cfg.device)), cfg.allow_mixed_devices)
    # a sharded run resumes only with the same N: each rank's sample file holds its own share
    config = asdict(cfg) | ({"world_size": ranks.world} if ranks.world > 1 else {})
    # a checkpoint retrained in the same folder starts a new run instead of finishing the old one's rows
    config["checkpoint_files"] = {k: checkpoint_stamp(v) for k, v in
                                  {**runner.paths, "neural_router": cfg.whiflash_neural_router_path}.items()}
    config["inputs"] = samples_sha256(samples)  # and an edited prompt file, its rows of the old prompts
    run, resumed = distributed.broadcast(prepare_run_dir(cfg.out, cfg.run_name(), config) if ranks.is_main else None)
    if config_dump is not None and not resumed and ranks.is_main:
        atomic_write_text(run / "config.yaml", config_dump)
    mine = ranks.share(samples)  # all of them in one process
    max_len = runner.prepare(mine)
    catchup_note = ("catch-up timed with synchronisation (--whiflash-time-catchup); speed figures include that cost"
                    if cfg.whiflash_time_catchup else "not timed (enable with --whiflash-time-catchup)")
    if ranks.is_main:
        # which GPU ran which samples: with paired speedups a reader can still compare ranks
        per_rank = [{"rank": r, **hw, "samples": [s.id for s in distributed.Ranks(r, ranks.world).share(samples)]}
                    for r, hw in enumerate(hardware)]
        write_manifest(run, argv=list(argv if argv is not None else sys.argv), seed=cfg.seed, device=runner.cfg.device,
                       models={**runner.paths, "neural_router": cfg.whiflash_neural_router_path, "preset": cfg.preset,
                               "latency_profile": cfg.whiflash_latency_profile,
                               "pair": cfg.whiflash_drafters, "tree_budget": cfg.ddtree_tree_budget},
                       samples=samples,
                       extra={"methods": runner.names, "tau_definition": TAU_DEFINITION, "protocol": PROTOCOL,
                              "cache_max_len": max_len, "cuda_graphs": runner.graphs,
                              "compiled_layers": runner.target.engine.compiled_layers,
                              "engine": describe(runner.cfg.device, cfg.dtype, runner.target.engine,
                                                 requested={"cuda_graphs": cfg.cuda_graphs,
                                                            "compile_layers": cfg.compile_layers},
                                                 flash_attn_flag=cfg.flash_attn),
                              "selection": [sel.to_dict() for sel in selection], "resumed": resumed,
                              "catchup": catchup_note, "strict_tolerance": cfg.strict_tolerance,
                              **({"ranks": per_rank} if ranks.world > 1 else {})})
    # each rank logs its own share as it goes (samples-rankR.jsonl); rank 0 merges them into samples.jsonl
    rows = run_samples(runner, mine, run, ranks.describe("bench samples"),
                       "samples.jsonl" if ranks.world == 1 else f"samples-rank{ranks.rank}.jsonl",
                       rotations(samples))
    if ranks.world > 1:
        rows = merge_rows(distributed.gather(rows), samples)
        if not ranks.is_main:  # rank 0 writes the results; every rank returns once they are there
            distributed.barrier()
            return BenchResult(run, {})
        atomic_write_text(run / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    results = aggregate(rows, runner.names, seed=cfg.seed, iterations=cfg.bootstrap)
    mismatches = [r["mismatch"] for r in rows if r.get("mismatch")]
    results.update({"mismatches": mismatches, "catchup_note": catchup_note, "run": str(run),
                    "lossless_check": "every output vs AR, token for token" if cfg.temperature == 0
                    else "skipped (temperature > 0: outputs are samples)",
                    "samples": len({r["sample"] for r in rows})})
    if cfg.temperature == 0:  # sampled decodes leave each other's paths: no shared states to judge on
        results.update({"decisions": shared_state_decisions(rows), "decisions_definition": DECISIONS_DEFINITION})
    write_results(run, results)
    if cfg.save_path:
        write_save_path(cfg.save_path, results, rows, asdict(cfg))
    if not cfg.no_plots:
        from .plots import write_plots

        write_plots(run, results, rows)
    bad = [m for m in mismatches if m.get("margin_fp32") is None or m["margin_fp32"] > cfg.strict_tolerance]
    for m in mismatches:
        log.error("lossless: %s differs from AR on %s turn %d at token %d (AR %s, method %s; fp32 margin %s)",
                  m["method"], m["sample"], m["turn"], m["position"], m["ar_token"], m["method_token"],
                  m["margin_fp32"])
    for o in results["timing_outliers"]:
        log.warning("timing: %s on %s turn %d took %.3f ms a round against its median %.3f (+%.1f ms once; %s)",
                    o["method"], o["sample"], o["turn"], o["ms_per_round"], o["median_ms_per_round"], o["excess_ms"],
                    one_off_text(o))
    log.info("%d rows, %d mismatches; results in %s", len(rows), len(mismatches), run)
    code = 1 if cfg.strict and bad else 0
    distributed.barrier()
    return BenchResult(run, results, mismatches, code)


def check_devices(hardware: list[dict[str, Any]], allow_mixed: bool) -> list[dict[str, Any]]:
    """Every rank's `device_info`, refused when the ranks' GPUs are different models unless `allow_mixed`."""
    models = {hw.get("gpu") for hw in hardware}
    if len(models) > 1 and not allow_mixed:
        ranks = ", ".join(f"rank {r}: {hw.get('gpu') or hw['device']}" for r, hw in enumerate(hardware))
        raise ValueError(f"the ranks run on different devices ({ranks}); expected one GPU model, so that figures "
                         "pooled over ranks describe one machine: pass --allow-mixed-devices to run anyway")
    return hardware


def merge_rows(shares: list[list[dict[str, Any]]], samples: list[Sample]) -> list[dict[str, Any]]:
    """The rows of every rank's share in sample order (each sample's rows as its rank wrote them)."""
    order = {s.id: i for i, s in enumerate(samples)}
    return sorted((row for rows in shares for row in rows), key=lambda row: order[row["sample"]])


def rotations(samples: list[Sample]) -> dict[str, int]:
    """Which method order (`method_order`) each sample takes: its index among the samples of its category, so
    that within every category the orders cycle (an index over all samples repeats one order per category when
    categories interleave as often as there are orders)."""
    seen: dict[str, int] = {}
    out: dict[str, int] = {}
    for s in samples:
        out[s.id] = seen.get(s.category, 0)
        seen[s.category] = out[s.id] + 1
    return out


def method_order(names: list[str], k: int) -> list[str]:
    """Order `k` of a Williams design over `names`: a Latin square in which, over one cycle (len(names) orders,
    twice that for an odd count), every method runs at every position equally often and directly after every
    other method equally often. A plain rotation balances positions only: each method would always follow the
    same one, and a decode measurably runs slower after some methods than after others (a heavy tree verify
    before it), a bias that would land on one method alone."""
    n = len(names)
    base = [0] + [(i + 1) // 2 if i % 2 else n - i // 2 for i in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    k %= n if n % 2 == 0 else 2 * n
    row = [names[(b + k) % n] for b in base]
    return row[::-1] if k >= n else row  # an odd count needs the mirrored square too


def run_samples(runner: Runner, samples: list[Sample], run: Path, desc: str,
                log_name: str = "samples.jsonl", rotation: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Every turn of every sample through `run_turn`, rows appended to `run/<log_name>` (resumable);
    returns all rows of that file, earlier ones included. `rotation` (default `rotations(samples)`; a sharded
    bench passes the whole run's) picks each sample's method order."""
    rotation = rotations(samples) if rotation is None else rotation
    rows_log = SampleLog(run / log_name)
    probe = MarginProbe(runner.paths["target"], device=runner.cfg.device)
    for sample in tqdm(samples, desc=desc):
        replies: list[str] = []
        for turn in range(sample.n_turns):
            run_turn(runner, rows_log, probe, sample, turn, rotation[sample.id], replies)
    return rows_log.rows


def run_turn(runner: Runner, rows_log: SampleLog, probe: MarginProbe, sample: Sample, turn: int, k: int,
              replies: list[str]) -> None:
    """Every method on one turn of one sample (in order `k` of `method_order`), the lossless check, and the rows."""
    names = runner.names_for(sample.category)
    order = method_order(names, k)
    ar_row = rows_log.find(sample.id, turn, "ar")
    ids = runner.encode(sample, turn, replies)
    if all(rows_log.find(sample.id, turn, n) for n in names):  # resumed: this turn is done
        replies.append(runner.decode_text(ar_row["tokens"]))
        return
    fresh: dict[str, dict[str, Any]] = {}
    for pos, name in enumerate(order):
        if rows_log.find(sample.id, turn, name):
            continue
        method = runner.method(name, sample.category)
        before = runner.one_off_now()
        out, st = runner.generate(method, ids)
        thr = method.threshold if method.threshold is not None else \
            getattr(getattr(method.drafter, "router", None), "threshold", None)
        fresh[name] = _row(sample, turn, method, pos, ids, out, st, thr, runner.cfg.whiflash_time_catchup)
        fresh[name].update({k: v - before[k] for k, v in runner.one_off_now().items()})  # paid once inside it
    ar = ar_row or fresh["ar"]
    for name in names:
        row = fresh.get(name)
        if row is None:
            continue
        row["ar_decode_seconds"], row["ar_new_tokens"] = ar["decode_seconds"], ar["new_tokens"]
        n, n_ar = decode_tokens(row["new_tokens"]), decode_tokens(ar["new_tokens"])
        ok = n and n_ar and row["decode_seconds"] > 0 and ar["decode_seconds"] > 0
        row["speedup"] = (ar["decode_seconds"] / n_ar) / (row["decode_seconds"] / n) if ok else None
        row["mismatch"] = None
        greedy = runner.cfg.temperature == 0
        pos = first_difference(ar["tokens"], row["tokens"]) if name != "ar" and greedy else None
        if pos is not None:
            get = lambda xs: xs[pos] if pos < len(xs) else None  # noqa: E731
            m = Mismatch(sample.id, turn, name, pos, get(ar["tokens"]), get(row["tokens"]))
            row["mismatch"] = probe.judge(m, ids, ar["tokens"]).to_dict()
        rows_log.append(row)
    replies.append(runner.decode_text(ar["tokens"]))
