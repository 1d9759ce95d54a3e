"""What routing adds to a round: standalone drafters against routed decoding pinned to one slot.

Usage: python scripts/bench_routing.py [--shapes small|qwen3-8b|DIR ...] [--new-tokens 128] [--repeats 5]
       python scripts/bench_routing.py --testbed DIR [--category code] [--prompts 4] [--new-tokens 128]

Random weights at real shapes (`--shapes`: a testbed preset, whose configs are written the way its build
writes them, a `checkpoints/` preset, or a folder with `{target,eagle3,dflash}/config.json`). Random
drafts are rejected, so every round commits one token and a round's time is its fixed cost: the draft,
the verify pass and what routing adds. Each routed method is pinned to one slot, so it drafts exactly as
the standalone drafter does and the difference is routing alone:

- `fixed`: a fixed slot, decided inside the verify pass;
- `neural`: a neural router (threshold far below or above its scores), decided inside the verify pass;
- `neural-after`: the same router asked after the pass from the path's last row (a router that reads the
  previous round decides that way);
- `sticky-0`: the neural router with `stick_tau` 1, so from the second round on slot 0 is kept without a decision
  (what a routed round costs where the parallel drafter runs well).

`switching`: a scripted policy asked after the pass that changes slot every round, against the mean of the same
policy pinned to either slot (`scripted-0`, `scripted-1`): what switching adds beyond the two slots' own rounds (the
backlog of two commits each member then catches up, the other verify graph, whatever the drafters' weights lose in
the device's caches).

Beside them, `ddtree`: DDTree at its default budget (block - 1) on the DFlash drafter's own weights, against
DFlash: what the tree (its build, the tree verify, the acceptance walk and the cache compaction) adds to a round.

Two diagnostics of slot 1 (EAGLE-3) take one piece of the pair away each:

- `neural-1-own-taps`: the verify pass writes EAGLE-3's tap layers only, not the union of both drafters';
- `neural-1-no-backlog`: DFlash is not a member, so no backlog of its rows builds up while EAGLE-3 drafts.

Methods run side by side in one process, interleaved, CUDA graphs on a GPU; the table gives the median
milliseconds per round over the repeats and each routed method's difference to its standalone drafter (`switching`:
to the mean of its two pinned forms).

`--testbed DIR` times the trained models of a built testbed instead, on its held-out test prompts of
`--category` (`--prompts` of them, each decoded to `--new-tokens` or its stop token), under the engine
`whiflash-eval bench` runs by default (CUDA graphs and compiled layers on a GPU): rounds then accept what
the drafters really accept, which random weights never do. Every output is compared with AR's.

`--testbed DIR --profile OUT` then runs each of EAGLE-3, DFlash and their routed variants over the same prompts
once more, under `torch.profiler` and (on a GPU) CUDA's sync-debug mode, and writes to OUT per method: the
operator tables by device and by host time (`profile_NAME.txt`), a Chrome trace of its first prompt
(`trace_NAME.json.gz`, 64 tokens), and `profile.json` with, per round, wall time, kernel time (what the GPU was
busy), host synchronisations (by source line) and kernels launched: where a routed round spends what its
standalone drafter does not.

`--launches` counts instead of timing (any device, a CPU included): per round, the operators each method
dispatches outside fixed-shape passes (each one a kernel launch and its host cost on a GPU) and the
fixed-shape passes it runs (each a graph replay under CUDA graphs, its input copies counted as operators).
What a routed method launches beyond its standalone drafter is host time every round.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import whiflash
from whiflash.drafters import DDTreeDrafter
from whiflash.router import NeuralRouter
from whiflash.routers import AlternatingRouter, ScriptedRouter


def testbed_shapes(preset: str, folder: Path) -> Path:
    """`{target,eagle3,dflash}/config.json` of testbed preset `preset`, as its build writes them, in `folder`."""
    from whiflash.runtime import ModelConfig
    from whiflash.testbed.dflash_train import dflash_config
    from whiflash.testbed.drafter_data import tap_layers
    from whiflash.testbed.eagle3_train import eagle3_config
    from whiflash.testbed.presets import get_preset
    from whiflash.testbed.target import qwen3_config

    cfg = get_preset(preset)
    vocab = cfg.tokenizer.vocab_size
    target = qwen3_config(cfg.target, {"vocab_size": vocab, "eos_token_id": 0, "pad_token_id": 0}).to_dict()
    tc = ModelConfig.from_dict(target, source=f"{preset} target")
    n = tc.num_hidden_layers
    parts = {"target": target, "eagle3": eagle3_config(cfg.eagle3, tc, tap_layers("eagle3", n)),
             "dflash": dflash_config(cfg.dflash, tc, tap_layers("dflash", n), mask_token_id=vocab - 1)}
    for part, config in parts.items():
        (folder / part).mkdir(parents=True, exist_ok=True)
        (folder / part / "config.json").write_text(json.dumps(config))
    return folder


class AfterThePass:
    """A policy without `rows`: the loop asks it after the verify pass, from the path's last row."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.policy(hidden, logits)


def methods(target: Any, eagle: Any, dflash: Any) -> dict[str, tuple[str, Any]]:
    """name -> (the method it is compared with: its standalone drafter, or `a|b`, the mean of two; drafter)."""
    router = NeuralRouter(target.config.hidden_size, drafters="df-e3").to(target.device).eval()
    pinned = {0: whiflash.NeuralPolicy(router, threshold=-1e9), 1: whiflash.NeuralPolicy(router, threshold=1e9)}
    routed = lambda policy, **kw: whiflash.RoutedDrafter("df-e3", policy, eagle3=eagle, dflash=dflash, **kw)  # noqa: E731
    out: dict[str, tuple[str, Any]] = {"ar": ("ar", None), "dflash": ("dflash", dflash), "eagle3": ("eagle3", eagle)}
    for slot, alone in ((0, "dflash"), (1, "eagle3")):
        out[f"fixed-{slot}"] = (alone, routed(whiflash.FixedRouter(slot)))
        out[f"neural-{slot}"] = (alone, routed(pinned[slot]))
        out[f"neural-after-{slot}"] = (alone, routed(AfterThePass(pinned[slot])))
    # random drafts accept nothing, so every round's tau is 1: stick_tau 1 keeps slot 0 from the second round on
    # without asking the policy, as stick_tau keeps a parallel drafter that accepts long blocks
    out["sticky-0"] = ("dflash", routed(pinned[0], stick_tau=1))
    # valid only because slot 1 drafts every round: DFlash's taps and backlog are never read, so it does not
    # take in the prompt either (its prefill would read its own tap layers off the prompt's commit)
    own_taps = routed(pinned[1])
    own_taps.tap_layers = tuple(eagle.tap_layers)
    own_taps.prefill = eagle.prefill  # type: ignore[method-assign]
    no_backlog = routed(pinned[1])
    no_backlog.members = [eagle]
    out["neural-1-own-taps"], out["neural-1-no-backlog"] = ("eagle3", own_taps), ("eagle3", no_backlog)
    for slot, alone in ((0, "dflash"), (1, "eagle3")):
        out[f"scripted-{slot}"] = (alone, routed(ScriptedRouter([slot])))
    out["switching"] = ("scripted-0|scripted-1", routed(AlternatingRouter(1)))
    out["ddtree"] = ("dflash", DDTreeDrafter.over(dflash, dflash.block_size - 1))
    return out


def _rows(shapes: str, table: dict[str, tuple[str, Any]], times: dict[str, list[float]],
          rounds: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    for name, (alone, _) in table.items():
        ms = statistics.median(times[name])
        base = statistics.fmean(statistics.median(times[b]) for b in alone.split("|"))
        rows.append({"shapes": shapes, "method": name, "rounds": rounds[name], "ms_per_round": round(ms, 4),
                     "vs_standalone_ms": round(ms - base, 4), "vs_standalone_pct": round(100 * (ms / base - 1), 2)})
    return rows


def measure(shapes: str, device: str, dtype: torch.dtype, new_tokens: int, prompt_tokens: int,
            repeats: int, folder: str | None = None) -> list[dict[str, Any]]:
    """Rows of the table for `shapes` (its configs in `folder` when given)."""
    from whiflash.eval.shapes import random_models

    target, eagle, dflash = random_models(folder or shapes, device, dtype)
    target.set_engine(target.engine.with_(cuda_graphs=device == "cuda", compiled_layers=False))
    prompt = torch.randint(0, target.config.vocab_size, (prompt_tokens,)).tolist()
    table = methods(target, eagle, dflash)
    times: dict[str, list[float]] = {name: [] for name in table}
    rounds: dict[str, int] = {}
    for r in range(repeats + 1):  # the first pass captures graphs and is not counted
        for name, (_, drafter) in table.items():
            _, stats = whiflash.generate(target, drafter, prompt, new_tokens)
            rounds[name] = stats.rounds
            if r:
                times[name].append(stats.decode_seconds / stats.rounds * 1e3)
    return _rows(shapes, table, times, rounds)


def measure_testbed(folder: Path, category: str, prompts: int, device: str, dtype: torch.dtype, new_tokens: int,
                    repeats: int, profile_dir: Path | None = None) -> tuple[list[dict[str, Any]], int]:
    """Rows of the table on a built testbed's test prompts of `category`, and how many outputs differ from AR's;
    with `profile_dir`, `profile_methods` too (its rows in `profile_dir/profile.json`)."""
    from whiflash.engine import engine_options
    from whiflash.session import Session, model_paths
    from whiflash.testbed.prompts import eval_prompts

    paths = model_paths(folder)
    cuda = device.startswith("cuda")
    session = Session.open(paths, device, str(dtype).removeprefix("torch."), engine_options(device, cuda, cuda))
    target = session.target
    eagle = whiflash.load_drafter("eagle3", paths["eagle3"], target)
    dflash = whiflash.load_drafter("dflash", paths["dflash"], target)
    ids = [session.encode([p]) for p in eval_prompts(folder, category, prompts)]
    if not ids:
        raise ValueError(f"--testbed {folder}: no test prompts of category {category!r}")
    table = methods(target, eagle, dflash)
    target.setup_cache(max(len(x) for x in ids) + new_tokens + max(d.max_nodes for _, d in table.values() if d) + 1)
    times: dict[str, list[float]] = {name: [] for name in table}
    rounds: dict[str, int] = {}
    outputs: dict[tuple[str, int], list[int]] = {}
    for r in range(repeats + 1):  # the first pass captures graphs (and compiles) and is not counted
        for name, (_, drafter) in table.items():
            seconds, n = 0.0, 0
            for i, prompt in enumerate(ids):
                out, stats = whiflash.generate(target, drafter, prompt, new_tokens, stop_token_ids=session.stops)
                seconds, n = seconds + stats.decode_seconds, n + stats.rounds
                outputs[name, i] = out
            rounds[name] = n
            if r:
                times[name].append(seconds / max(1, n) * 1e3)
    differ = [(name, i) for name in table for i in range(len(ids)) if outputs[name, i] != outputs["ar", i]]
    if differ:  # a finding to look into (bf16 near-ties, or a bug), so say where
        print("outputs that differ from AR's (method, prompt):", ", ".join(f"{n} {i}" for n, i in differ))
    if profile_dir is not None:
        print_profile(profile_methods(table, target, ids, new_tokens, session.stops, profile_dir))
    return _rows(f"{folder.name}:{category}", table, times, rounds), len(differ)


PROFILED = ("eagle3", "fixed-1", "neural-1", "neural-after-1", "neural-1-own-taps", "neural-1-no-backlog",
            "dflash", "neural-0", "ddtree")
"""The methods `--profile` looks into: each slot's standalone drafter and its routed variants, and DDTree."""


def _decode_all(target: Any, drafter: Any, ids: list[list[int]], new_tokens: int, stops: Any) -> int:
    """Decode every prompt; the rounds they took."""
    return sum(whiflash.generate(target, drafter, p, new_tokens, stop_token_ids=stops)[1].rounds for p in ids)


def _kernel_us(events: Any) -> tuple[float, int]:
    """(microseconds the device spent in kernels, kernels) over a profile's averaged events."""
    from torch.autograd import DeviceType

    total, count = 0.0, 0
    for e in events:
        if e.device_type != DeviceType.CPU:
            total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
            count += e.count
    return total, count


def profile_methods(table: dict[str, tuple[str, Any]], target: Any, ids: list[list[int]], new_tokens: int,
                    stops: Any, out: Path) -> list[dict[str, Any]]:
    """Per method of `PROFILED`: a round's wall and kernel time, host synchronisations and kernels, and the
    operator tables and first-prompt trace in `out` (see the module doc)."""
    from torch.profiler import ProfilerActivity, profile

    out.mkdir(parents=True, exist_ok=True)
    cuda = target.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    rows = []
    for name in PROFILED:
        drafter = table[name][1]
        syncs: Counter[str] = Counter()
        if cuda:  # every synchronising call, by the Python line that made it
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    _decode_all(target, drafter, ids, new_tokens, stops)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs.update(f"{Path(w.filename).name}:{w.lineno}" for w in caught)
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            rounds = _decode_all(target, drafter, ids, new_tokens, stops)
            if cuda:
                torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        events = prof.key_averages()
        kernel_us, kernels = _kernel_us(events)
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        tables = [f"# {name}: {rounds} rounds over {len(ids)} prompts, {new_tokens} new tokens each"]
        for key in dict.fromkeys((sort, "self_cpu_time_total")):
            try:
                tables.append(events.table(sort_by=key, row_limit=40))
            except (AttributeError, KeyError, ValueError):  # an older profiler's names
                tables.append(events.table(sort_by=key.replace("device", "cuda"), row_limit=40))
        (out / f"profile_{name}.txt").write_text("\n\n".join(tables) + "\n")
        with profile(activities=activities) as short:
            _decode_all(target, drafter, ids[:1], min(new_tokens, 64), stops)
        trace = out / f"trace_{name}.json"
        short.export_chrome_trace(str(trace))
        with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
        rows.append({"method": name, "standalone": table[name][0], "rounds": rounds,
                     "wall_ms_per_round": round(wall / rounds * 1e3, 4),
                     "kernel_ms_per_round": round(kernel_us / rounds / 1e3, 4),
                     "kernels_per_round": round(kernels / rounds, 1),
                     "syncs_per_round": round(sum(syncs.values()) / rounds, 3),
                     "syncs_by_line": dict(syncs.most_common(12))})
    (out / "profile.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


class _Launches(TorchDispatchMode):
    """Counts operators dispatched outside fixed-shape passes, by name, and the passes themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.passes = 0
        self.inside = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.inside:
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def count_launches(shapes: str, device: str, dtype: torch.dtype, new_tokens: int, prompt_tokens: int,
                   folder: str | None = None, toy: bool = False) -> list[dict[str, Any]]:
    """Per method: operators a round dispatches outside fixed-shape passes, passes a round, and the operators
    a routed method dispatches beyond its standalone drafter (name: extra count over the run). Rounds only:
    a two-token decode (the prefill and one round) is counted too and taken off. `toy`: the shapes' layers and
    tap layers at toy widths (the counts do not depend on widths)."""
    from whiflash.eval.shapes import random_models
    from whiflash.runtime.graphs import FixedShapePasses

    target, eagle, dflash = random_models(folder or shapes, device, dtype, toy=toy)
    for model in (target, eagle, dflash):  # fixed-shape passes, as CUDA graphs run them, on any device
        model.static = True
    prompt = torch.randint(0, target.config.vocab_size, (prompt_tokens,)).tolist()
    table = methods(target, eagle, dflash)
    counter = _Launches()
    run_fixed = FixedShapePasses.run_fixed

    def counted(self: Any, key: Any, fn: Any, *inputs: Any, **kw: Any) -> Any:
        counter.passes += 1
        counter.ops["copy_ (pass input)"] += 0 if kw.get("alias_inputs") else len(inputs)
        counter.inside += 1
        try:
            return run_fixed(self, key, fn, *inputs, **kw)
        finally:
            counter.inside -= 1

    per: dict[str, tuple[int, Counter[str], int]] = {}
    FixedShapePasses.run_fixed = counted  # type: ignore[method-assign]
    try:
        for name, (_, drafter) in table.items():
            whiflash.generate(target, drafter, prompt, 2)  # first use of every pass
            runs = []
            for tokens in (2, new_tokens):  # the short run's counts (prefill, one round) come off the long one's
                counter.ops, counter.passes = Counter(), 0
                with counter:
                    _, stats = whiflash.generate(target, drafter, prompt, tokens)
                runs.append((stats.rounds, counter.ops, counter.passes))
            (r0, ops0, p0), (r1, ops1, p1) = runs
            per[name] = (r1 - r0, ops1 - ops0, p1 - p0)
    finally:
        FixedShapePasses.run_fixed = run_fixed  # type: ignore[method-assign]
    rows = []
    for name, (alone, _) in table.items():
        rounds, ops, passes = per[name]
        bases = [per[b][1] for b in alone.split("|")]  # `a|b`: their mean
        base = {k: sum(b[k] for b in bases) / len(bases) for k in set().union(ops, *bases)}
        extra = {k: ops[k] - base[k] for k in sorted(base, key=lambda k: base[k] - ops[k]) if ops[k] != base[k]}
        rows.append({"shapes": shapes, "method": name, "rounds": rounds,
                     "ops_per_round": round(sum(ops.values()) / rounds, 2),
                     "passes_per_round": round(passes / rounds, 2),
                     "extra_vs_standalone": extra})
    return rows


def print_profile(rows: list[dict[str, Any]]) -> None:
    """The `--profile` table: a round's wall and kernel time, synchronisations and kernels, per method."""
    print("| method | vs | rounds | wall ms/round (under the profiler) | kernel ms/round | syncs/round | kernels/round | syncs by line |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lines = ", ".join(f"{k} {v / r['rounds']:.2f}" for k, v in r["syncs_by_line"].items())
        print(f"| {r['method']} | {r['standalone']} | {r['rounds']} | {r['wall_ms_per_round']:.4f} | "
              f"{r['kernel_ms_per_round']:.4f} | {r['syncs_per_round']:.2f} | {r['kernels_per_round']:.1f} | "
              f"{lines or '—'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["small", "qwen3-8b"],
                    help="testbed presets (small, tiny, ...), checkpoints/ presets (qwen3-8b, ...) or config folders")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--launches", action="store_true",
                    help="count operators and fixed-shape passes per round instead of timing (any device)")
    ap.add_argument("--testbed", type=Path, help="a built testbed: time its trained models on its test prompts")
    ap.add_argument("--category", default="code", help="--testbed: the category of the test prompts")
    ap.add_argument("--prompts", type=int, default=4, help="--testbed: test prompts, each decoded every repeat")
    ap.add_argument("--profile", type=Path, metavar="OUT",
                    help="--testbed: profile EAGLE-3, DFlash and their routed variants into OUT (see the module doc)")
    args = ap.parse_args()
    from whiflash.testbed.presets import PRESETS

    rows = []
    if args.profile is not None and args.testbed is None:
        ap.error("--profile looks into a built testbed's trained models: give --testbed DIR")
    if args.testbed is not None:
        if args.launches:
            ap.error("--launches counts operators of random-weight shapes (--shapes); drop --testbed")
        rows, mismatches = measure_testbed(args.testbed, args.category, args.prompts, args.device,
                                           getattr(torch, args.dtype), args.new_tokens, args.repeats, args.profile)
        args.shapes = []
        print(f"{mismatches} outputs differ from AR's")
    with tempfile.TemporaryDirectory() as tmp:
        for shapes in args.shapes:
            folder = str(testbed_shapes(shapes, Path(tmp) / shapes)) if shapes in PRESETS else None
            if args.launches:
                rows += count_launches(shapes, args.device, getattr(torch, args.dtype), args.new_tokens,
                                       args.prompt_tokens, folder)
            else:
                rows += measure(shapes, args.device, getattr(torch, args.dtype), args.new_tokens,
                                args.prompt_tokens, args.repeats, folder)
    if args.launches:
        print("| shapes | method | rounds | operators / round | passes / round | beyond the standalone drafter |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            extra = ", ".join(f"{k} {v / row['rounds']:+.2f}" for k, v in row["extra_vs_standalone"].items())
            print(f"| {row['shapes']} | {row['method']} | {row['rounds']} | {row['ops_per_round']:.2f} | "
                  f"{row['passes_per_round']:.2f} | {extra or '—'} |")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
    print("| shapes | method | rounds | ms/round | vs standalone |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['shapes']} | {row['method']} | {row['rounds']} | {row['ms_per_round']:.4f} | "
              f"{row['vs_standalone_ms']:+.4f} ms ({row['vs_standalone_pct']:+.2f}%) |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
