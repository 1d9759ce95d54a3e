"""Real-shape latency profile on one GPU: graph-captured components against their floors and a
stock transformers anchor (DESIGN.md section 8). Random weights, bf16, configs from checkpoints/.

Usage: python scripts/profile_shapes.py [--models qwen3-8b,qwen3-4b,llama3.1-8b-instruct] [--ctx 1024] [--json OUT]

Per model: copy-bandwidth floor of an AR step (weight + KV bytes / measured copy bandwidth); AR step,
chain verify of 8/16 tokens and tree verify of 33/129 nodes as CUDA-graph replays (GPU time: CUDA
events around back-to-back replays) and as eager calls; each drafter's round at the released shapes
(EAGLE-3: 1 layer, 32k draft vocabulary, 6 steps; DFlash: 5 layers, block 16); catch-up for backlogs of
1-64; for the first model also the same AR step and DFlash-shaped round with stock transformers
(eager modules, DynamicCache) and the full speculative loop, graph vs eager, with the per-round time
spent outside GPU kernels. Tables are printed last.
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
from whiflash.drafters.ddtree import ancestor_mask
from whiflash.runtime import ModelConfig, Target

ROOT = Path(__file__).resolve().parents[1] / "checkpoints"
DEV = torch.device("cuda")


def randomise(module: torch.nn.Module) -> torch.nn.Module:
    """Materialise a meta-built module on the GPU in bf16 with small random weights (norms at 1)."""
    module = module.to(dtype=torch.bfloat16).to_empty(device=DEV)
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
    fn(); torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=DEV)
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
    tcfg = json.loads((ROOT / name / "target" / "config.json").read_text())
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
        target.use_cuda_graphs(graphs)
        tag = "graph" if graphs else "eager"
        res[f"ar_{tag}_gpu_ms"] = gpu_ms(target_pass(1))
        res[f"ar_{tag}_wall_ms"] = wall_ms(target_pass(1))
    target.use_cuda_graphs(True)
    for t in (8, 16):
        res[f"verify{t}_ms"] = gpu_ms(target_pass(t))
    for t in (33, 129):
        res[f"tree{t}_ms"] = gpu_ms(target_pass(t, tree=True))

    # drafters at the released shapes
    dcfg = json.loads((ROOT / name / "dflash" / "config.json").read_text())
    ecfg = json.loads((ROOT / name / "eagle3" / "config.json").read_text())
    with torch.device("meta"):
        dflash = build_drafter("dflash", dcfg, target)
        eagle = build_drafter("eagle3", ecfg, target, num_steps=6)
    dflash, eagle = randomise(dflash), randomise(eagle)
    taps = tuple(sorted(set(dflash.tap_layers) | set(eagle.tap_layers)))
    h = cfg.hidden_size

    def commit(start: int, n: int) -> Commit:
        return Commit(torch.randn(n, len(taps), h, device=DEV, dtype=torch.bfloat16),
                      torch.randint(0, 1000, (n,), device=DEV), start, taps)

    pending = ids[:1]
    for d in (dflash, eagle):
        d.reset(target, max_len)
        d.observe(commit(0, ctx))
        d.catch_up()
        d.use_cuda_graphs(True)
    res["dflash_round_ms"] = gpu_ms(lambda: dflash.propose(pending, ctx))

    def eagle_round() -> Any:
        eagle.kv_len = ctx - 4
        eagle.observe(commit(ctx - 4, 4))  # a typical backlog of tau = 4
        return eagle.propose(pending, ctx)

    res["eagle3_round_ms"] = gpu_ms(eagle_round)
    res["catchup_ms"] = {}
    for n in (1, 4, 16, 64):
        def cu_e(n=n) -> None:
            eagle.kv_len = ctx - n
            eagle.observe(commit(ctx - n, n))
            eagle.catch_up()

        def cu_d(n=n) -> None:
            dflash.kv_len = ctx - n
            dflash.observe(commit(ctx - n, n))
            dflash.catch_up()

        res["catchup_ms"][n] = {"eagle3": gpu_ms(cu_e), "dflash": gpu_ms(cu_d)}

    if anchor:
        res.update(hf_anchor(tcfg, dcfg, ctx))
        with torch.device("meta"):
            ddtree = build_drafter("ddtree", dcfg, target, tree_budget=32)
        res["loop"] = full_loop(target, eagle, dflash, randomise(ddtree), ctx)
    del target, dflash, eagle
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
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        prompt = torch.randint(0, 1000, (1, ctx), device=DEV)
        with torch.no_grad():
            cache = DynamicCache(config=config)
            model(prompt, past_key_values=cache, use_cache=True)
            step_ids = torch.randint(0, 1000, (1, n_new), device=DEV)

            def step() -> Any:
                o = model(step_ids, past_key_values=cache, use_cache=True, logits_to_keep=n_new)
                cache.crop(ctx)
                return o

            out[f"{label}_gpu_ms"] = gpu_ms(step, n=10)
            out[f"{label}_wall_ms"] = wall_ms(step, n=10)
        del model, cache
        torch.cuda.empty_cache()
    return out


def full_loop(target: Target, eagle, dflash, ddtree, ctx: int) -> dict[str, dict[str, float]]:
    """Whole rounds (random weights: tau ~ 1, every component still runs), graph vs eager."""
    routed = whiflash.RoutedDrafter("df-e3", whiflash.AlternatingRouter(), eagle3=eagle, dflash=dflash)
    prompt = torch.randint(0, 1000, (ctx,), device=DEV)
    table = {}
    for name, d in (("ar", None), ("eagle3", eagle), ("dflash", dflash), ("ddtree-b32", ddtree), ("whiflash-alt", routed)):
        row = {}
        for graphs in (True, False):
            for m in (target, eagle, dflash, ddtree):
                m.use_cuda_graphs(graphs)
            whiflash.generate(target, d, prompt, 8)
            per_round = []
            for _ in range(3):
                _, s = whiflash.generate(target, d, prompt, 48)
                per_round.append(s.decode_seconds / s.rounds * 1e3)
            row["graph_round_ms" if graphs else "eager_round_ms"] = statistics.median(per_round)
        table[name] = row
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-4b,llama3.1-8b-instruct")
    ap.add_argument("--ctx", type=int, default=1024, help="committed context length for every measurement")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    bw = copy_bandwidth()
    results = []
    for i, m in enumerate(args.models.split(",")):
        results.append(profile_model(m, args.ctx, bw, anchor=(i == 0)))
        print(json.dumps(results[-1]), flush=True)  # partial results survive a time limit
    dev = torch.cuda.get_device_name()
    print(f"\n{dev}, bf16, random weights, context {args.ctx}, copy bandwidth {bw / 1e12:.2f} TB/s (read+write)")
    print(f"{'model':<22}{'floor':>7}{'AR graph':>9}{'x floor':>8}{'AR eager':>9}{'ver8':>7}{'ver16':>7}{'tree33':>7}"
          f"{'tree129':>8}{'DF rnd':>7}{'E3 rnd':>7}   (ms; GPU time)")
    for r in results:
        print(f"{r['model']:<22}{r['floor_ms']:>7.3f}{r['ar_graph_gpu_ms']:>9.3f}{r['ar_graph_gpu_ms'] / r['floor_ms']:>8.2f}"
              f"{r['ar_eager_wall_ms']:>9.3f}{r['verify8_ms']:>7.3f}{r['verify16_ms']:>7.3f}{r['tree33_ms']:>7.3f}"
              f"{r['tree129_ms']:>8.3f}{r['dflash_round_ms']:>7.3f}{r['eagle3_round_ms']:>7.3f}")
    print("\ncatch-up (KV-only prefill) GPU ms by backlog, eager: model: n -> eagle3 / dflash")
    for r in results:
        print(f"  {r['model']}: " + ", ".join(f"{n}: {v['eagle3']:.3f}/{v['dflash']:.3f}" for n, v in r["catchup_ms"].items()))
    a = results[0]
    if "hf_ar_gpu_ms" in a:
        print(f"\nstock transformers anchor ({a['model']}): AR step wall {a['hf_ar_wall_ms']:.2f} ms vs ours (graph) "
              f"{a['ar_graph_wall_ms']:.2f} ms = {a['hf_ar_wall_ms'] / a['ar_graph_wall_ms']:.2f}x; DFlash-shaped round wall "
              f"{a['hf_dflash_shape_wall_ms']:.2f} ms vs ours {a['dflash_round_ms']:.2f} ms (GPU) = "
              f"{a['hf_dflash_shape_wall_ms'] / a['dflash_round_ms']:.2f}x")
        print(f"\nfull rounds ({a['model']}, random weights so tau ~ 1), wall ms per round:")
        kernels = {  # GPU time of the round's components, measured above (tau ~ 1: backlog of 1)
            "ar": a["ar_graph_gpu_ms"],
            "eagle3": a["eagle3_round_ms"] + a["verify8_ms"],
            "dflash": a["dflash_round_ms"] + a["verify16_ms"] + a["catchup_ms"][1]["dflash"],
        }
        for name, row in a["loop"].items():
            extra = ""
            if name in kernels:
                outside = 1 - kernels[name] / row["graph_round_ms"]
                extra = f"   outside GPU kernels ~{outside:.0%}"
            print(f"  {name:<14} graph {row['graph_round_ms']:7.3f}   eager {row['eager_round_ms']:7.3f}   "
                  f"eager/graph {row['eager_round_ms'] / row['graph_round_ms']:.2f}x{extra}")
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "ctx": args.ctx, "bandwidth": bw, "results": results}, indent=2))


if __name__ == "__main__":
    main()
