"""Real-shape latency profile on one GPU: graph-captured components against their floors and a
stock transformers anchor (docs/design.md, "Performance"). Random weights, bf16, configs from checkpoints/.

Usage: python scripts/profile_shapes.py [--models qwen3-8b,qwen3-4b,llama3.1-8b-instruct] [--ctx 1024] [--json OUT]
       [--rounds] [--compile] [--options-only] [--no-diagnostics]

Per model, the component profile `whiflash-eval profile` writes (whiflash.eval.profile.profile_models):
AR step, chain verify at each drafter's width, tree verify of 33/129 nodes (DDTree budgets 32/128),
each drafter's draft at the released shapes (EAGLE-3: 1 layer, 32k draft vocabulary, 6 steps; DFlash:
5 layers, block 16), catch-up for backlogs of 1-64, routers and the copy-bandwidth floor, as CUDA-graph
replays timed with CUDA events; plus this script's diagnostics for the first model: the AR step as eager
calls; the engine options side by side (SDPA, the decode attention kernel, + torch.compile'd layer
stages, + the GEMV kernel: AR step, verify 16, tree 33, kernel count); one layer's attention (SDPA
vs the kernel at several split counts); the step's weight products (cuBLAS vs the GEMV kernel, share
of copy bandwidth); the kernels of an AR step; the same AR step and DFlash-shaped round with stock
transformers (eager modules, DynamicCache); and whole rounds, graph vs eager, with the share of a
round spent outside GPU kernels and a cProfile table of where the host time goes (`--rounds`: whole
rounds and the option tables for every model). Tables are printed last.

`--smoke` runs every step of the script on the CPU with the configs shrunk to toy widths (same layer
counts and tap layers, graphs off, wall-clock timing): a check of the script itself before spending
GPU time on it; its figures mean nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

import whiflash
from whiflash.drafters.base import Commit
from whiflash.drafters.trees import ancestor_mask
from whiflash.latency import LatencyProfile
from whiflash.eval.profile import _catch_up, _tree, floor_ms, profile_models
from whiflash.eval.shapes import random_drafter, random_models, shape_config
from whiflash.eval.timing import copy_bandwidth, device_ms, wall_ms
from whiflash.runtime import Target, decode_attention, gemv, layers
from whiflash.runtime import model as runtime_model
from whiflash.runtime.graphs import Graphed

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.bfloat16
_smoke = False
_compiled = False  # --compile: the component profiles' targets run compiled layer stages


def graphs_on(*modules: Any, enabled: bool = True) -> None:
    """CUDA graphs on or off for every module (always off on the CPU, where there are none)."""
    for m in modules:
        m.use_cuda_graphs(enabled and DEV.type == "cuda")


def gpu_ms(fn: Callable[[], Any], n: int = 30) -> float:
    return device_ms(fn, DEV, n=2 if _smoke else n)  # --smoke checks the script; its figures mean nothing


def wall(fn: Callable[[], Any], n: int = 20) -> float:
    return wall_ms(fn, DEV, n=2 if _smoke else n)


def options_only(name: str, ctx: int, bw: float) -> dict[str, Any]:
    """Just the engine-option tables of one model (variants, attention, weight products), about a minute."""
    target, eagle, dflash = random_models(name, DEV, DTYPE, toy=_smoke)
    target.setup_cache(ctx + 256)
    res = {"model": name, "floor_ms": floor_ms(target, ctx, bw),
           "variants": engine_variants(target, taps=tuple(sorted({*eagle.tap_layers, *dflash.tap_layers})), ctx=ctx),
           "attention": attention_table(target, ctx, bw), "gemv": gemv_table(target, bw)}
    del target, eagle, dflash
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return res


def profile_model(name: str, ctx: int, bw: float, anchor: bool, rounds: bool = False) -> dict[str, Any]:
    """The shared component profile (`whiflash.eval.profile.profile_models`: AR step, verify at each
    drafter's width, tree verify at budgets 32/128, drafts, catch-up, routers) plus this script's
    diagnostics: the eager AR step, and for the anchor model the kernel table, torch.compile, the stock
    transformers anchor and whole rounds graph vs eager (`rounds`: whole rounds for this model too)."""
    target, eagle, dflash = random_models(name, DEV, DTYPE, toy=_smoke)
    target.set_engine(target.engine.with_(compiled_layers=_compiled))  # the drafters take it at reset
    prof = profile_models(target, eagle3=eagle, dflash=dflash, tree_budgets=(32, 128), context=ctx, graphs=True,
                          bandwidth=bw)
    res: dict[str, Any] = {"model": name, "layers": target.config.num_hidden_layers, "floor_ms": prof.floor,
                           "ar_graph_gpu_ms": prof.ar_step,
                           "ar_graph_wall_ms": prof.meta["ar_step_wall_ms"], "profile": prof.to_json(),
                           "ratios": prof.ratios()}
    ids = torch.randint(0, 1000, (2,), device=DEV)
    step = lambda: target(ids[:1], ctx, logits="all")  # noqa: E731
    graphs_on(target, enabled=False)
    res["ar_eager_gpu_ms"], res["ar_eager_wall_ms"] = gpu_ms(step), wall(step)
    if anchor:  # where an AR step's GPU time goes: the graph's kernels, run as fixed-shape eager calls
        target.static = True
        res["ar_kernels"] = kernel_table(step)
        target.static = False
    if anchor or rounds:  # the engine's options side by side: SDPA vs the decode kernel, eager vs compiled stages
        res["variants"] = engine_variants(target, taps=tuple(sorted({*eagle.tap_layers, *dflash.tap_layers})),
                                          ctx=ctx)
        res["attention"] = attention_table(target, ctx, bw)
    if anchor:
        res["gemv"] = gemv_table(target, bw)
        res["catchup_kernels"] = catchup_kernels(target, eagle, dflash, ctx)
        graphs_on(dflash)
        res["dflash_round_wall_ms"] = wall(lambda: dflash.draft(ids[:1], ctx))
        res.update(hf_anchor(shape_config(name, "target", _smoke), shape_config(name, "dflash", _smoke), ctx))
    if anchor or rounds:
        ddtree = random_drafter("ddtree", shape_config(name, "dflash", _smoke), target, tree_budget=32)
        res["loop"] = full_loop(target, eagle, dflash, ddtree, ctx)
    del target, dflash, eagle
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return res


VARIANTS = {"sdpa": (False, False, False), "decode-kernel": (True, False, False),
            "decode-kernel+gemv": (True, False, True), "decode-kernel+compile": (True, True, False),
            "decode-kernel+compile+gemv": (True, True, True)}
"""Engine options compared side by side: (decode attention kernel, torch.compile'd layer stages, the
GEMV kernel for the layers' products). "decode-kernel+gemv" is the engine's default."""
BEST = "decode-kernel+compile+gemv"
"""The variant with every option on: the AR step the summary holds against the floor."""


def engine_variants(target: Target, taps: tuple[int, ...], ctx: int) -> dict[str, dict[str, Any]]:
    """AR step, 16-token chain verify and 33-node tree verify (graph replays, GPU ms) and the AR step's
    kernel count under each of `VARIANTS`; the engine's settings are restored afterwards."""
    ids = torch.randint(0, 1000, (33,), device=DEV)
    parents, depths = _tree(32, 15)  # the profile's 33-node DDTree shape (root + 32 nodes)
    mask = ancestor_mask(parents).to(DEV)
    pos = ctx + torch.cat([torch.zeros(1, dtype=torch.long), depths]).to(DEV)
    passes = {"ar": lambda: target(ids[:1], ctx, logits="all"),
              "verify16": lambda: target(ids[:16], ctx, None, None, taps, logits="all"),
              "tree33": lambda: target(ids[:33], ctx, pos, mask, taps, logits="all")}
    out: dict[str, dict[str, Any]] = {}
    default = target.engine
    try:
        for name, (kernel, compiled, products) in VARIANTS.items():
            if products and gemv.triton is None:
                continue
            target.set_engine(default.with_(attention_kernel=kernel, gemv=products, compiled_layers=compiled))
            target.drop_graphs()
            graphs_on(target)
            row: dict[str, Any] = {}
            try:
                t0 = time.perf_counter()
                for fn in passes.values():  # first calls capture graphs (and compile)
                    fn()
                row["setup_s"] = time.perf_counter() - t0
                for key, fn in passes.items():
                    row[f"{key}_ms"] = gpu_ms(fn)
                # one step from an idle GPU, call to result: what a round pays on top of the GPU time for
                # launching the graph (its CPU launch cost grows with the kernel count)
                row["ar_idle_wall_ms"] = wall(passes["ar"])
                row["ar_idle_one_graph_ms"] = one_graph_idle(target, passes["ar"])
                graphs_on(target, enabled=False)
                target.static = True
                k = kernel_table(passes["ar"])
                row["ar_kernels"] = k["kernels"] if k else None
                if compiled and k:
                    row["ar_kernel_top"] = k["top"]
            except Exception as exc:  # report, keep profiling
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            target.static = False
            out[name] = row
    finally:
        target.set_engine(default)
        target.drop_graphs()
        graphs_on(target, enabled=False)
    return out


def one_graph_idle(target: Target, step: Callable[[], Any]) -> float:
    """`wall` of `step` with the target's passes as one graph (no head graph ahead of the tail): what the
    head/tail split of `Target._fixed` saves is this minus the two-graph figure."""
    head = runtime_model.HEAD_LAYERS
    try:
        runtime_model.HEAD_LAYERS = 0
        target.drop_graphs()
        step()  # capture
        return wall(step)
    finally:
        runtime_model.HEAD_LAYERS = head
        target.drop_graphs()


def graph_us(fn: Callable[[], Any], calls: int = 1) -> float:
    """GPU us of one of `calls` calls that `fn` makes, captured as a CUDA graph and timed over its
    replays (direct calls from Python would time the host's launches, not the kernels)."""
    if DEV.type != "cuda":
        return 1e3 * gpu_ms(fn) / calls
    graph = Graphed(fn)
    return 1e3 * gpu_ms(graph, n=50) / calls


def attention_table(target: Target, ctx: int, bw: float) -> dict[str, dict[str, float]]:
    """One layer's fixed-shape attention over a static cache of `ctx + 256` slots with `ctx` committed,
    SDPA vs the decode kernel at several split counts, for 1 / 16 / 33 query rows (GPU us), beside
    the time to read the live K/V once at copy bandwidth."""
    cfg = target.config
    slots = ctx + 256
    k = torch.randn(cfg.num_key_value_heads, slots, cfg.head_dim, device=DEV, dtype=DTYPE)
    v = torch.randn_like(k)
    kv_bytes = 2 * k[:, :ctx].numel() * k.element_size()
    out = {}
    default = decode_attention.MAX_SPLITS
    try:
        for t in (1, 16, 33):
            q = torch.randn(cfg.num_attention_heads, t, cfg.head_dim, device=DEV, dtype=DTYPE)
            mask = torch.zeros(t, slots, dtype=torch.bool, device=DEV)
            mask[:, :ctx] = True
            mask[:, ctx:ctx + t] = torch.ones(t, t, dtype=torch.bool, device=DEV).tril_()
            row = {"sdpa_us": graph_us(lambda: layers.attention(q, k, v, mask, fixed_shape=True, kernel=False)),
                   "kv_read_us": 1e6 * kv_bytes / bw}
            if decode_attention.usable(q, k, mask):
                row["kernel_us"] = graph_us(lambda: decode_attention.masked_attention(q, k, v, mask))  # its default
                for splits in (8, 16, 32, 64):
                    decode_attention.MAX_SPLITS = splits
                    row[f"kernel_{splits}_us"] = graph_us(lambda: decode_attention.masked_attention(q, k, v, mask))
            out[str(t)] = row
    finally:
        decode_attention.MAX_SPLITS = default
    return out


def gemv_table(target: Target, bw: float) -> dict[str, dict[str, float]]:
    """The decode step's weight products (one layer's and the LM head) at 1 and 16 rows: GPU us of
    cuBLAS and of the GEMV kernel (`whiflash.runtime.gemv`, when Triton is here) and the share of copy
    bandwidth the weight read reaches (a graph of one product per weight copy, 8 copies, so the 50 MB
    L2 cache does not serve them)."""
    layer = target.model.layers[0]
    weights = {"qkv": layer.self_attn.qkv.weight, "o_proj": layer.self_attn.o_proj.weight,
               "gate_up": layer.mlp.gate_up.weight, "down": layer.mlp.down_proj.weight,
               "lm_head": target.lm_head.weight}
    out = {}
    for name, w in weights.items():
        copies = [w.clone() for _ in range(8 if name != "lm_head" else 2)]
        for m in (1, 16):
            x = torch.randn(m, w.shape[1], device=DEV, dtype=w.dtype)
            us = graph_us(lambda: [torch.nn.functional.linear(x, c) for c in copies], calls=len(copies))
            row = {"us": us, "bandwidth_share": w.numel() * w.element_size() / (us / 1e6) / bw, "shape": list(w.shape)}
            if gemv.triton is not None and DEV.type == "cuda":
                row["kernel_us"] = graph_us(lambda: [gemv.gemv(x, c) for c in copies], calls=len(copies))
                row["kernel_share"] = w.numel() * w.element_size() / (row["kernel_us"] / 1e6) / bw
            out[f"{name}@{m}"] = row
        del copies
    return out


def host_table(fn: Callable[[], int], top: int = 12) -> list[tuple[str, float, int]]:
    """Where a generation's host time goes: cProfile's `top` functions by own time over one call of
    `fn` (a generation returning its round count), as (function, own ms per round, calls per round)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    rounds = fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [(f"{Path(f).name}:{line} {fn_name}"[:70], own * 1e3 / rounds, calls // max(rounds, 1))
            for (f, line, fn_name), (calls, _, own, _, _) in rows]


def hf_anchor(tcfg: dict, dcfg: dict, ctx: int) -> dict[str, float]:
    """Stock transformers at equal work: one AR step, and a 16-token block through 5 Qwen3 layers
    over a cached context (the DFlash round's shape), both eager with a DynamicCache."""
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    out = {}
    for label, cfg_dict, n_new in (("hf_ar", tcfg, 1), ("hf_dflash_shape", dict(tcfg, num_hidden_layers=5), 16)):
        config = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "architectures"})
        config._attn_implementation = "sdpa"
        with torch.device(DEV):
            model = AutoModelForCausalLM.from_config(config, dtype=DTYPE).eval()
        prompt = torch.randint(0, 1000, (1, ctx), device=DEV)
        with torch.no_grad():
            cache = DynamicCache(config=config)
            model(prompt, past_key_values=cache, use_cache=True)
            step_ids = torch.randint(0, 1000, (1, n_new), device=DEV)

            def step() -> Any:
                o = model(step_ids, past_key_values=cache, use_cache=True, logits_to_keep=n_new)
                cache.crop(-n_new)  # back to the context (negative: tokens to drop, every transformers 5.x)
                return o

            out[f"{label}_gpu_ms"] = gpu_ms(step, n=10)
            out[f"{label}_wall_ms"] = wall(step, n=10)
            if n_new == 1:  # the whole stock loop at equal work: greedy generate() of 48 tokens
                model.generation_config.eos_token_id = None  # random weights: never stop early

                def loop(n: int) -> Callable[[], Any]:
                    return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)

                # the difference drops the prefill and the first token, which both runs share
                out["hf_ar_loop_ms_per_token"] = (wall(loop(49), n=3) - wall(loop(1), n=3)) / 48
        del model, cache
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
    return out


def kernel_table(fn: Callable[[], Any], top: int = 12) -> dict[str, Any] | None:
    """Kernels of one call (torch.profiler over CUPTI) grouped by name: total launches and GPU ms,
    and the `top` names by GPU time; None on the CPU or where CUPTI cannot be read."""
    if DEV.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except Exception as exc:  # no CUPTI on this machine: report the gap instead of failing the run
        print(f"kernel time not measured: {exc}", flush=True)
        return None
    rows = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0),
                  key=lambda e: -e.self_device_time_total)
    return {"kernels": sum(e.count for e in rows), "gpu_ms": sum(e.self_device_time_total for e in rows) / 1e3,
            "top": [(e.key[:70], e.count, e.self_device_time_total / 1e3) for e in rows[:top]]}


def catchup_kernels(target: Target, eagle, dflash, ctx: int) -> dict[str, Any]:
    """Kernels of one catch-up as the engine runs it (graph replays and their input copies) per drafter
    at backlogs 4 and 64: what the catch-up rows of the summary spend their time on."""
    taps = tuple(sorted({*eagle.tap_layers, *dflash.tap_layers}))
    out: dict[str, Any] = {}
    for kind, d in (("eagle3", eagle), ("dflash", dflash)):
        graphs_on(target, d)
        d.reset(target, target.max_len)
        for n in (4, 64):
            feats = torch.randn(n, len(taps), target.config.hidden_size, device=DEV, dtype=DTYPE)
            backlog = Commit(feats, torch.randint(0, 1000, (n,), device=DEV), ctx - n, taps)
            call = lambda: _catch_up(d, backlog)  # noqa: E731
            call()  # captures the graphs
            out[f"{kind}@{n}"] = kernel_table(call)
    graphs_on(target, eagle, dflash, enabled=False)
    return out


def full_loop(target: Target, eagle, dflash, ddtree, ctx: int) -> dict[str, dict[str, float]]:
    """Whole rounds (random weights: tau ~ 1, every component still runs), graph vs eager.

    Per method: median wall ms per round over 3 generations of 48 tokens in each mode, and for the
    graph mode the summed kernel time per round of one profiled generation; ``outside_kernels`` =
    1 - kernel / wall is the share of the round the GPU is not running a kernel (host work, launch
    gaps, the one device read).
    """
    routed = whiflash.RoutedDrafter("df-e3", whiflash.AlternatingRouter(), eagle3=eagle, dflash=dflash)
    prompt = torch.randint(0, 1000, (ctx,), device=DEV)
    table = {}
    for name, d in (("ar", None), ("eagle3", eagle), ("dflash", dflash), ("ddtree-b32", ddtree), ("whiflash-alt", routed)):
        row: dict[str, float] = {}
        for graphs in (True, False):
            graphs_on(target, eagle, dflash, ddtree, enabled=graphs)
            whiflash.generate(target, d, prompt, 8)
            per_round = []
            for _ in range(3):
                _, s = whiflash.generate(target, d, prompt, 48)
                per_round.append(s.decode_seconds / s.rounds * 1e3)
            row["graph_round_ms" if graphs else "eager_round_ms"] = statistics.median(per_round)
            if graphs:
                stats = []
                k = kernel_table(lambda: stats.append(whiflash.generate(target, d, prompt, 48)[1]))
                if k is not None:  # the prefill's kernels are not part of a round
                    prefill = kernel_table(lambda: target.forward(prompt, 0, logits="last"))
                    row["kernel_round_ms"] = (k["gpu_ms"] - (prefill["gpu_ms"] if prefill else 0.0)) / stats[0].rounds
                    row["outside_kernels"] = 1 - row["kernel_round_ms"] / row["graph_round_ms"]
                row["host_top"] = host_table(lambda: whiflash.generate(target, d, prompt, 48)[1].rounds)
        table[name] = row
    return table


def ratio_table(results: list[dict[str, Any]]) -> str:
    """Every component over its model's AR step, models side by side; each later model also as a share of
    the first's ratio (a testbed is in the real cost regime when these stay near 1, e.g. within +-30%)."""
    names = [Path(r["model"]).name or r["model"] for r in results]
    keys = list(dict.fromkeys(k for r in results for k in r["ratios"]))
    head = f"{'x AR step':<28}" + "".join(f"{n[:16]:>17}" for n in names)
    head += "".join(f"{'/ ' + names[0][:12]:>17}" for _ in names[1:])
    lines = ["cost ratios (component / AR step), side by side:", head]
    for k in keys:
        vals = [r["ratios"].get(k) for r in results]
        row = f"{k:<28}" + "".join(f"{v:>17.3f}" if v is not None else f"{'-':>17}" for v in vals)
        base = vals[0]
        row += "".join(f"{v / base:>17.2f}" if v is not None and base else f"{'-':>17}" for v in vals[1:])
        lines.append(row)
    return "\n".join(lines)


def summary_table(results: list[dict[str, Any]]) -> str:
    """The engine's figures against their goals (results/), one column per model: floor, AR step
    per engine option, verify / AR, attention per layer, kernels per step, share of a round outside GPU
    kernels, an EAGLE-3 step in target layers, catch-up shares, stock transformers. '-': not measured
    for that model (the option tables and whole rounds need the anchor or --rounds)."""
    def get(r: dict[str, Any], *path: Any) -> Any:
        for key in path:
            r = r[key]
        return r

    def cell(fn: Callable[[dict[str, Any]], str], r: dict[str, Any]) -> str:
        try:
            return fn(r)
        except KeyError:  # not measured for this model
            return "-"

    def variant(name: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: f"{get(r, 'variants', name, 'ar_ms'):.2f} = {get(r, 'variants', name, 'ar_ms') / r['floor_ms']:.2f}x"

    def catchup(kind: str, small: bool) -> Callable[[dict[str, Any]], str]:
        def share(r: dict[str, Any]) -> str:
            ms = get(r, "profile", "ms")
            shares = [t / ms["round"][kind] for n, t in ms["catchup"][kind].items() if (int(n) <= 16) == small]
            return f"{min(shares):.1%}-{max(shares):.1%}" if len(shares) > 1 else f"{shares[0]:.1%}"
        return share

    def eagle_step(r: dict[str, Any]) -> str:
        # the draft times the steps after the first (width - 2 of them): the first step's full pass ends the
        # catch-up, whose result the draft starts from
        ms = get(r, "profile", "ms")
        steps = get(r, "profile", "widths", "eagle3") - 2
        return f"{ms['draft']['eagle3'] / steps / (ms['ar_step'] / r['layers']):.2f}"

    def outside(r: dict[str, Any]) -> str:
        shares = [row["outside_kernels"] for row in r["loop"].values()]
        return f"{min(shares):.1%}-{max(shares):.1%}"

    rows = [
        ("weight+KV read floor, ms", lambda r: f"{r['floor_ms']:.3f}"),
        ("AR step, defaults, ms (x floor)", lambda r: f"{r['ar_graph_gpu_ms']:.2f} = {r['ar_graph_gpu_ms'] / r['floor_ms']:.2f}x"),
        ("AR step, SDPA", variant("sdpa")),
        ("AR step, decode kernel", variant("decode-kernel")),
        ("AR step, + GEMV (engine default)", variant("decode-kernel+gemv")),
        ("AR step, compiled, no GEMV", variant("decode-kernel+compile")),
        ("AR step, compiled + GEMV", variant(BEST)),
        ("verify 16 / AR, defaults", lambda r: f"{get(r, 'profile', 'ms', 'verify', '16') / r['ar_graph_gpu_ms']:.2f}"),
        ("verify 16 / AR, compiled + GEMV", lambda r: f"{get(r, 'variants', BEST, 'verify16_ms') / get(r, 'variants', BEST, 'ar_ms'):.2f}"),
        ("attention 1 row, us: SDPA / kernel", lambda r: f"{get(r, 'attention', '1', 'sdpa_us'):.1f} / {get(r, 'attention', '1', 'kernel_us'):.1f}"),
        ("kernels per step: SDPA / all options",
         lambda r: f"{get(r, 'variants', 'sdpa', 'ar_kernels') or '-'} / {get(r, 'variants', BEST, 'ar_kernels') or '-'}"),
        ("round outside GPU kernels", outside),
        ("EAGLE-3 step / target layer", eagle_step),
        ("catch-up / round, EAGLE-3 n<=16", catchup("eagle3", True)),
        ("catch-up / round, EAGLE-3 n=64", catchup("eagle3", False)),
        ("catch-up / round, DFlash n<=16", catchup("dflash", True)),
        ("catch-up / round, DFlash n=64", catchup("dflash", False)),
        ("stock generate() / our AR loop", lambda r: f"{r['hf_ar_loop_ms_per_token'] / r['loop']['ar']['graph_round_ms']:.2f}x"),
    ]
    names = [Path(r["model"]).name or r["model"] for r in results]
    lines = ["engine figures against their goals (docs/engine.md):", f"{'':<38}" + "".join(f"{n[:22]:>24}" for n in names)]
    lines += [f"{label:<38}" + "".join(f"{cell(fn, r):>24}" for r in results) for label, fn in rows]
    return "\n".join(lines)


def print_options(results: list[dict[str, Any]], ctx: int) -> None:
    """The engine-option tables: variants and attention per model, weight products of the first."""
    for r in (r for r in results if "variants" in r):
        print(f"\n{r['model']} engine options, graph replays (GPU ms; floor {r['floor_ms']:.3f}; AR idle: wall ms of "
              "one step from an idle GPU, the target's head and tail graphs / one graph):")
        print(f"  {'variant':<28}{'AR step':>9}{'x floor':>8}{'verify16':>9}{'/AR':>6}{'tree33':>8}{'kernels':>8}{'setup s':>8}"
              f"{'AR idle':>9}{'1 graph':>9}")
        for name, row in r["variants"].items():
            if "error" in row:
                print(f"  {name:<28}failed: {row['error']}")
                continue
            print(f"  {name:<28}{row['ar_ms']:>9.3f}{row['ar_ms'] / r['floor_ms']:>8.2f}{row['verify16_ms']:>9.3f}"
                  f"{row['verify16_ms'] / row['ar_ms']:>6.2f}{row['tree33_ms']:>8.3f}{row['ar_kernels'] or '-':>8}"
                  f"{row['setup_s']:>8.1f}{row.get('ar_idle_wall_ms', float('nan')):>9.3f}"
                  f"{row.get('ar_idle_one_graph_ms', float('nan')):>9.3f}")
        print(f"\n{r['model']} attention, one layer, context {ctx} (GPU us, graph replays): rows -> SDPA; "
              "decode kernel as set; with at most 8 / 16 / 32 / 64 key splits; live K/V read at copy bandwidth")
        for t, row in r["attention"].items():
            kern = " / ".join(f"{row.get(f'kernel_{n}_us', float('nan')):6.1f}" for n in (8, 16, 32, 64))
            print(f"  {t:>3}: {row['sdpa_us']:7.1f};  {row.get('kernel_us', float('nan')):6.1f};  {kern};  "
                  f"{row['kv_read_us']:6.1f}")
    a = results[0]
    if "gemv" in a:
        print(f"\n{a['model']} weight products (GPU us, share of copy bandwidth): cuBLAS; GEMV kernel")
        for key, row in a["gemv"].items():
            kern = f"{row['kernel_us']:>9.1f}{row['kernel_share']:>8.0%}" if "kernel_us" in row else ""
            print(f"  {key:<12}{str(row['shape']):>16}{row['us']:>9.1f}{row['bandwidth_share']:>8.0%};{kern}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-4b,llama3.1-8b-instruct",
                    help="comma-separated checkpoints/ presets or folders with {target,eagle3,dflash}/config.json "
                         "(a testbed); the first is the anchor of the diagnostics and of the ratio comparison")
    ap.add_argument("--ctx", type=int, default=1024, help="committed context length for every measurement")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="check the script on the CPU at toy widths")
    ap.add_argument("--no-diagnostics", action="store_true",
                    help="skip the first model's kernel table, torch.compile, transformers anchor and whole rounds "
                         "(the component profiles and the ratio table only: about a minute per model)")
    ap.add_argument("--rounds", action="store_true",
                    help="whole rounds (graph vs eager, share outside kernels, host profile) for every model")
    ap.add_argument("--options-only", action="store_true",
                    help="only the engine-option tables (variants, attention, weight products) of every model")
    ap.add_argument("--compile", action="store_true",
                    help="the component profiles with torch.compile'd layer stages (EngineOptions."
                         "compiled_layers); the anchor's variant table compares both either way")
    args = ap.parse_args()
    global DEV, DTYPE, _smoke, _compiled
    if args.smoke:
        DEV, DTYPE, _smoke = torch.device("cpu"), torch.float32, True
    elif DEV.type != "cuda":
        raise SystemExit("profile_shapes.py needs a CUDA device (or --smoke for a CPU check of the script)")
    torch.backends.cuda.matmul.allow_tf32 = True
    bw = copy_bandwidth(DEV)
    results = []
    _compiled = args.compile
    for i, m in enumerate(args.models.split(",")):
        if args.options_only:
            results.append(options_only(m, args.ctx, bw))
        else:
            results.append(profile_model(m, args.ctx, bw, anchor=(i == 0 and not args.no_diagnostics),
                                         rounds=args.rounds))
        print(json.dumps(results[-1]), flush=True)  # partial results survive a time limit
    dev = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (smoke: toy widths)"
    if args.options_only:
        print(f"\n{dev}, {str(DTYPE).removeprefix('torch.')}, random weights, context {args.ctx}")
        print_options(results, args.ctx)
        print("\n" + summary_table(results))
        return
    print(f"\n{dev}, {str(DTYPE).removeprefix('torch.')}, random weights, context {args.ctx}, copy bandwidth {bw / 1e12:.2f} TB/s (read+write)")
    print(f"{'model':<22}{'floor':>7}{'AR graph':>9}{'x floor':>8}{'AR eager':>9}   (ms; GPU time, eager: wall)")
    for r in results:
        print(f"{r['model']:<22}{r['floor_ms']:>7.3f}{r['ar_graph_gpu_ms']:>9.3f}{r['ar_graph_gpu_ms'] / r['floor_ms']:>8.2f}"
              f"{r['ar_eager_wall_ms']:>9.3f}")
    for r in results:  # the shared component table: ms and ratio to the AR step
        print(f"\n{r['model']}: " + LatencyProfile.from_json(r["profile"]).table())
    print("\n" + ratio_table(results))
    a = results[0]
    print_options(results, args.ctx)
    if a.get("ar_kernels"):
        k = a["ar_kernels"]
        print(f"\n{a['model']} AR step kernels (fixed-shape pass, eager): {k['kernels']} launches, {k['gpu_ms']:.3f} ms "
              "of kernel time; by name: launches, ms")
        for name, count, ms in k["top"]:
            print(f"  {count:>5} {ms:8.3f}  {name}")
    for name, row in a.get("variants", {}).items():
        if row.get("ar_kernel_top"):
            print(f"\n{a['model']} AR step kernels, {name} (fixed-shape pass, eager): {row['ar_kernels']} launches; "
                  "top names: launches, ms")
            for kname, count, ms in row["ar_kernel_top"]:
                print(f"  {count:>5} {ms:8.3f}  {kname}")
    for key, k in (a.get("catchup_kernels") or {}).items():
        if k:
            print(f"\n{a['model']} catch-up {key} kernels (graph replay + input copies): {k['kernels']} launches, "
                  f"{k['gpu_ms']:.3f} ms of kernel time; top names: launches, ms")
            for kname, count, ms in k["top"]:
                print(f"  {count:>5} {ms:8.3f}  {kname}")
    print("\ncatch-up (KV-only prefill, fixed-shape passes) by backlog n, GPU ms and share of that drafter's round "
          "(its draft + verify GPU time): model: n -> eagle3 / dflash")
    for r in results:
        ms = r["profile"]["ms"]
        e3, df = ms["round"]["eagle3"], ms["round"]["dflash"]
        print(f"  {r['model']}: " + ", ".join(f"{n}: {t:.3f} ({t / e3:.1%}) / {ms['catchup']['dflash'][n]:.3f} "
                                             f"({ms['catchup']['dflash'][n] / df:.1%})"
                                             for n, t in ms["catchup"]["eagle3"].items()))
    if "hf_ar_gpu_ms" in a:
        print(f"\nstock transformers anchor ({a['model']}): AR step wall {a['hf_ar_wall_ms']:.2f} ms vs ours (graph) "
              f"{a['ar_graph_wall_ms']:.2f} ms = {a['hf_ar_wall_ms'] / a['ar_graph_wall_ms']:.2f}x; DFlash-shaped round wall "
              f"{a['hf_dflash_shape_wall_ms']:.2f} ms vs ours (graph) {a['dflash_round_wall_ms']:.2f} ms = "
              f"{a['hf_dflash_shape_wall_ms'] / a['dflash_round_wall_ms']:.2f}x")
        print(f"\nfull rounds ({a['model']}, random weights so tau ~ 1), wall ms per round:")
        for name, row in a["loop"].items():
            extra = f"   outside GPU kernels {row['outside_kernels']:.1%}" if "outside_kernels" in row else ""
            print(f"  {name:<14} graph {row['graph_round_ms']:7.3f}   eager {row['eager_round_ms']:7.3f}   "
                  f"eager/graph {row['eager_round_ms'] / row['graph_round_ms']:.2f}x{extra}")
        if "hf_ar_loop_ms_per_token" in a:
            ours = a["loop"]["ar"]["graph_round_ms"]
            print(f"  stock transformers generate(), greedy AR: {a['hf_ar_loop_ms_per_token']:.3f} ms/token vs ours "
                  f"(graph) {ours:.3f} = {a['hf_ar_loop_ms_per_token'] / ours:.2f}x")
    for r in results:
        for name, row in r.get("loop", {}).items():
            if r is not a:
                extra = f", outside GPU kernels {row['outside_kernels']:.1%}" if "outside_kernels" in row else ""
                print(f"\n{r['model']} {name}: graph {row['graph_round_ms']:.3f} ms per round{extra}")
            print(f"  host time by function ({r['model']}, {name}, graph mode): own ms per round, calls per round")
            for fn_name, ms, calls in row["host_top"][:8]:
                print(f"    {ms:7.3f} {calls:>5}  {fn_name}")
    print("\n" + summary_table(results))
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "ctx": args.ctx, "bandwidth": bw, "results": results}, indent=2))


if __name__ == "__main__":
    main()
