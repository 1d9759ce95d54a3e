"""Real-shape latency profile on one GPU: graph-captured components against their floors and a
stock transformers anchor (docs/design.md, "Performance"). Random weights, bf16, configs from checkpoints/.

Usage: python scripts/profile_shapes.py [--models qwen3-8b,qwen3-4b,llama3.1-8b-instruct] [--ctx 1024] [--json OUT]

Per model: copy-bandwidth floor of an AR step (weight + KV bytes / measured copy bandwidth); AR step,
chain verify of 8/16 tokens and tree verify of 33/129 nodes as CUDA-graph replays (GPU time: CUDA
events around back-to-back replays) and as eager calls; each drafter's round at the released shapes
(EAGLE-3: 1 layer, 32k draft vocabulary, 6 steps; DFlash: 5 layers, block 16); catch-up for backlogs of
1-64; for the first model also the same AR step and DFlash-shaped round with stock transformers
(eager modules, DynamicCache) and the full speculative loop, graph vs eager, with the per-round time
spent outside GPU kernels. Tables are printed last.

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
from whiflash.drafters import build_drafter
from whiflash.drafters.base import Commit
from whiflash.drafters.trees import ancestor_mask
from whiflash.runtime import ModelConfig, Target
from whiflash.runtime import model as model_module

ROOT = Path(__file__).resolve().parents[1] / "checkpoints"
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.bfloat16
SMOKE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 32, "vocab_size": 2048, "draft_vocab_size": 512}
"""Widths that --smoke writes over every config (layer counts and taps stay)."""
_smoke = False


def load_config(name: str, part: str) -> dict:
    """One offline config from checkpoints/, shrunk to toy widths under --smoke."""
    cfg = json.loads((ROOT / name / part / "config.json").read_text())
    if _smoke:
        cfg.update({k: v for k, v in SMOKE.items() if k in cfg})
        cfg.get("dflash_config", {})["mask_token_id"] = SMOKE["vocab_size"] - 1
    return cfg


def graphs_on(*modules: Any, enabled: bool = True) -> None:
    """CUDA graphs on or off for every module (always off on the CPU, where there are none)."""
    for m in modules:
        m.use_cuda_graphs(enabled and DEV.type == "cuda")


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def randomise(module: torch.nn.Module) -> torch.nn.Module:
    """Materialise a meta-built module on the GPU in bf16 with small random weights (norms at 1)."""
    module = module.to(dtype=DTYPE).to_empty(device=DEV)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.fill_(1.0) if p.dim() == 1 else p.normal_(0, 0.02)
        for name, b in module.named_buffers():
            if b.dtype == torch.long:
                b.zero_()
            elif b.dtype == torch.bool:
                b.fill_(True)
    return module.eval()


def gpu_ms(fn: Callable[[], Any], n: int = 30) -> float:
    """Median GPU time of one call, from CUDA events around n back-to-back calls (3 batches)."""
    if DEV.type != "cuda":
        return wall_ms(fn, n=3)
    fn(); fn()
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / n)
    return statistics.median(times)


def wall_ms(fn: Callable[[], Any], n: int = 20) -> float:
    """Median wall latency of one synchronised call."""
    fn(); sync()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (read + write) over a 2 GiB buffer."""
    x = torch.empty(2 * 1024**3 if DEV.type == "cuda" else 2**24, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    ms = gpu_ms(lambda: y.copy_(x), n=10)
    return 2 * x.numel() / (ms / 1e3)  # bytes read + written per second


def chain_tree(n_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A DDTree-like shape: a 15-deep main chain with the rest as first-level siblings."""
    depth = min(15, n_nodes)
    parents = list(range(depth)) + [0] * (n_nodes - depth)
    depths = list(range(1, depth + 1)) + [1] * (n_nodes - depth)
    return torch.tensor(parents), torch.tensor(depths)


def profile_model(name: str, ctx: int, bw: float, anchor: bool) -> dict[str, Any]:
    tcfg = load_config(name, "target")
    cfg = ModelConfig.from_dict(tcfg)
    with torch.device("meta"):
        target = Target(cfg, name=name)
    target = randomise(target)
    if cfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    max_len = ctx + 256
    target.setup_cache(max_len)
    res: dict[str, Any] = {"model": name}
    weight_bytes = sum(p.numel() for n, p in target.named_parameters() if "embed_tokens" not in n or cfg.tie_word_embeddings) * 2
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * ctx * cfg.head_dim * 2
    res["floor_ms"] = (weight_bytes + kv_bytes) / bw * 1e3
    ids = torch.randint(0, 1000, (130,), device=DEV)

    def target_pass(t: int, tree: bool = False) -> Callable[[], Any]:
        mask = pos = None
        if tree:
            parents, depths = chain_tree(t - 1)
            mask = ancestor_mask(parents).to(DEV)
            pos = ctx + torch.cat([torch.zeros(1, dtype=torch.long), depths]).to(DEV)
        return lambda: target(ids[:t], ctx, pos, mask, logits="all")

    for graphs in (True, False):
        graphs_on(target, enabled=graphs)
        tag = "graph" if graphs else "eager"
        res[f"ar_{tag}_gpu_ms"] = gpu_ms(target_pass(1))
        res[f"ar_{tag}_wall_ms"] = wall_ms(target_pass(1))
    if anchor:  # where an AR step's GPU time goes: the graph's kernels, run as fixed-shape eager calls
        graphs_on(target, enabled=False)
        target.static = True
        res["ar_kernels"] = kernel_table(target_pass(1))
        target.static = False
    if anchor:  # the same step with torch.compile'd layers inside the graph: how much fusion buys
        try:
            # not adopted by the engine: every (pass length, cache length) pair compiles anew
            target._fixed_layer = torch.compile(model_module._layer, fullgraph=True, dynamic=False)
            graphs_on(target)
            target.static = True
            t0 = time.perf_counter()
            target_pass(1)()
            res["compile_s"] = time.perf_counter() - t0
            res["ar_compiled_gpu_ms"] = gpu_ms(target_pass(1))
        except Exception as exc:  # report, keep profiling
            res["compile_error"] = f"{type(exc).__name__}: {exc}"[:400]
        target.static = False
        target._fixed_layer = model_module._layer
    graphs_on(target)
    for t in (8, 16):
        res[f"verify{t}_ms"] = gpu_ms(target_pass(t))
    for t in (33, 129):
        res[f"tree{t}_ms"] = gpu_ms(target_pass(t, tree=True))

    # drafters at the released shapes
    dcfg = load_config(name, "dflash")
    ecfg = load_config(name, "eagle3")
    with torch.device("meta"):
        dflash = build_drafter("dflash", dcfg, target)
        eagle = build_drafter("eagle3", ecfg, target, num_steps=6)
    dflash, eagle = randomise(dflash), randomise(eagle)
    taps = tuple(sorted(set(dflash.tap_layers) | set(eagle.tap_layers)))
    h = cfg.hidden_size

    def commit(start: int, n: int) -> Commit:
        return Commit(torch.randn(n, len(taps), h, device=DEV, dtype=DTYPE),
                      torch.randint(0, 1000, (n,), device=DEV), start, taps)

    pending = ids[:1]
    for d in (dflash, eagle):
        d.reset(target, max_len)
        d.observe(commit(0, ctx))
        d.catch_up()
        graphs_on(d)
    res["dflash_round_ms"] = gpu_ms(lambda: dflash.propose(pending, ctx))
    res["dflash_round_wall_ms"] = wall_ms(lambda: dflash.propose(pending, ctx))

    tau4 = commit(ctx - 4, 4)  # a typical backlog: the round before accepted 3 drafts + the bonus

    def eagle_round() -> Any:
        eagle.kv_len = ctx - 4
        eagle.observe(tau4)
        return eagle.propose(pending, ctx)

    res["eagle3_round_ms"] = gpu_ms(eagle_round)
    res["catchup_ms"] = {}
    for n in (1, 4, 16, 64):
        backlog = commit(ctx - n, n)

        def cu_e(n: int = n, backlog: Commit = backlog) -> None:
            eagle.kv_len = ctx - n
            eagle.observe(backlog)
            eagle.catch_up()

        def cu_d(n: int = n, backlog: Commit = backlog) -> None:
            dflash.kv_len = ctx - n
            dflash.observe(backlog)
            dflash.catch_up()

        res["catchup_ms"][n] = {"eagle3": gpu_ms(cu_e), "dflash": gpu_ms(cu_d)}

    if anchor:
        res.update(hf_anchor(tcfg, dcfg, ctx))
        with torch.device("meta"):
            ddtree = build_drafter("ddtree", dcfg, target, tree_budget=32)
        res["loop"] = full_loop(target, eagle, dflash, randomise(ddtree), ctx)
    del target, dflash, eagle
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return res


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
            out[f"{label}_wall_ms"] = wall_ms(step, n=10)
            if n_new == 1:  # the whole stock loop at equal work: greedy generate() of 48 tokens
                model.generation_config.eos_token_id = None  # random weights: never stop early

                def loop(n: int) -> Callable[[], Any]:
                    return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)

                # the difference drops the prefill and the first token, which both runs share
                out["hf_ar_loop_ms_per_token"] = (wall_ms(loop(49), n=3) - wall_ms(loop(1), n=3)) / 48
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
        table[name] = row
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-4b,llama3.1-8b-instruct")
    ap.add_argument("--ctx", type=int, default=1024, help="committed context length for every measurement")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="check the script on the CPU at toy widths")
    args = ap.parse_args()
    global DEV, DTYPE, _smoke
    if args.smoke:
        DEV, DTYPE, _smoke = torch.device("cpu"), torch.float32, True
    elif DEV.type != "cuda":
        raise SystemExit("profile_shapes.py needs a CUDA device (or --smoke for a CPU check of the script)")
    torch.backends.cuda.matmul.allow_tf32 = True
    bw = copy_bandwidth()
    results = []
    for i, m in enumerate(args.models.split(",")):
        results.append(profile_model(m, args.ctx, bw, anchor=(i == 0)))
        print(json.dumps(results[-1]), flush=True)  # partial results survive a time limit
    dev = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (smoke: toy widths)"
    print(f"\n{dev}, {str(DTYPE).removeprefix('torch.')}, random weights, context {args.ctx}, copy bandwidth {bw / 1e12:.2f} TB/s (read+write)")
    print(f"{'model':<22}{'floor':>7}{'AR graph':>9}{'x floor':>8}{'AR eager':>9}{'ver8':>7}{'ver16':>7}{'tree33':>7}"
          f"{'tree129':>8}{'DF rnd':>7}{'E3 rnd':>7}   (ms; GPU time)")
    for r in results:
        print(f"{r['model']:<22}{r['floor_ms']:>7.3f}{r['ar_graph_gpu_ms']:>9.3f}{r['ar_graph_gpu_ms'] / r['floor_ms']:>8.2f}"
              f"{r['ar_eager_wall_ms']:>9.3f}{r['verify8_ms']:>7.3f}{r['verify16_ms']:>7.3f}{r['tree33_ms']:>7.3f}"
              f"{r['tree129_ms']:>8.3f}{r['dflash_round_ms']:>7.3f}{r['eagle3_round_ms']:>7.3f}")
    a = results[0]
    if "ar_compiled_gpu_ms" in a:
        print(f"\n{a['model']} AR step with torch.compile'd layers in the graph: {a['ar_compiled_gpu_ms']:.3f} ms = "
              f"{a['ar_compiled_gpu_ms'] / a['floor_ms']:.2f}x floor (compiled in {a['compile_s']:.0f} s)")
    elif "compile_error" in a:
        print(f"\n{a['model']} AR step with torch.compile'd layers: failed: {a['compile_error']}")
    if a.get("ar_kernels"):
        k = a["ar_kernels"]
        print(f"\n{a['model']} AR step kernels (fixed-shape pass, eager): {k['kernels']} launches, {k['gpu_ms']:.3f} ms "
              "of kernel time; by name: launches, ms")
        for name, count, ms in k["top"]:
            print(f"  {count:>5} {ms:8.3f}  {name}")
    print("\ncatch-up (KV-only prefill, fixed-shape passes) by backlog n, GPU ms and share of that drafter's round "
          "(its draft + verify GPU time): model: n -> eagle3 / dflash")
    for r in results:
        e3 = r["eagle3_round_ms"] + r["verify8_ms"]
        df = r["dflash_round_ms"] + r["verify16_ms"]
        print(f"  {r['model']}: " + ", ".join(f"{n}: {v['eagle3']:.3f} ({v['eagle3'] / e3:.1%}) / {v['dflash']:.3f} "
                                             f"({v['dflash'] / df:.1%})" for n, v in r["catchup_ms"].items()))
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
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "ctx": args.ctx, "bandwidth": bw, "results": results}, indent=2))


if __name__ == "__main__":
    main()
