"""DDTree's tree and walk: the Triton kernels against the tensor ops, side by side.

Usage: python scripts/bench_tree.py [--budgets 15,32,64] [--depth 15] [--vocab 151936] [--cases 50]

For each budget, checks on `--cases` random and tied drafts that both builders give the same tree (tokens,
parents, depths, ancestor mask) from the same top-k, and that the top-k kernel picks what a stable sort of the
log-softmax picks (ties to the lower token id); then times each as one CUDA graph replay of `tree_proposal` (top-k
and builder, as a DDTree round runs it: log-softmax and `topk` with the sort-based builder, the top-k kernel with
the tree kernels), of the top-k alone and of the builder alone, in GPU us, and counts the builder's kernels.
Last, the walk of each budget's tree after its verify pass (`verify.accept`), tensor ops against the one-launch
kernel: GPU us per graph replay, and us per eager call as a DDTree round runs it (launches included).
"""
from __future__ import annotations

import argparse
import time

import torch

from whiflash.decoding import verify
from whiflash.drafters import trees
from whiflash.eval.timing import device_ms
from whiflash.runtime.graphs import Graphed


def kernels(fn) -> int:
    """CUDA kernels one eager call of `fn` launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="15,32,64", help="tree budgets (nodes), comma-separated")
    ap.add_argument("--depth", type=int, default=15, help="draft depths (a DFlash block of 16 drafts 15)")
    ap.add_argument("--vocab", type=int, default=151936, help="draft vocabulary (Qwen3's by default)")
    ap.add_argument("--cases", type=int, default=50, help="random and tied drafts checked per budget")
    args = ap.parse_args()
    if not torch.cuda.is_available() or trees.triton is None:
        raise SystemExit("bench_tree.py needs a CUDA device and Triton")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: depth {args.depth}, vocab {args.vocab}; GPU us per graph replay")
    print(f"{'budget':>6} {'same trees':>10} {'top-k':>6} {'proposal: sort':>15} {'kernel':>8} {'top-k: ops':>11} "
          f"{'kernel':>8} {'builder: sort':>14} {'kernel':>8} {'kernels: sort':>14} {'kernel':>7}")
    walks: list[tuple[int, float, float, float, float]] = []
    for budget in map(int, args.budgets.split(",")):
        same = same_k = 0
        for case in range(args.cases):
            logits = torch.randn(args.depth, args.vocab, device=dev, generator=gen) * 3
            if case % 2:  # few distinct values: ties between siblings and across depths
                logits = logits.round()
            logp, ids = trees.top_logp(logits, budget, kernel=False)
            out = [trees.build_tree_device(logp, ids, budget, kernel=on) for on in (False, True)]
            same += all(torch.equal(getattr(out[0], f), getattr(out[1], f))
                        for f in ("tokens", "parents", "depths", "tree_mask"))
            stable = torch.sort(-torch.log_softmax(logits, -1), dim=-1, stable=True).indices[:, :budget]
            same_k += torch.equal(trees.top_logp(logits, budget)[1], stable)
        logits = torch.randn(args.depth, args.vocab, device=dev, generator=gen) * 3
        top_logp, top_ids = torch.log_softmax(logits, -1).topk(budget, -1)
        row = []
        for fn in (lambda on: trees.tree_proposal(logits, budget, on),
                   lambda on: trees.top_logp(logits, budget, on),
                   lambda on: trees.build_tree_device(top_logp, top_ids, budget, on)):
            for on in (False, True):
                row.append(1e3 * device_ms(Graphed(lambda fn=fn, on=on: fn(on)), dev, n=50))
        counts = [kernels(lambda on=on: trees.build_tree_device(top_logp, top_ids, budget, on)) for on in (False, True)]
        walks.append((budget, *walk_us(trees.tree_proposal(logits, budget), args.vocab, dev, gen)))
        print(f"{budget:>6} {same:>7}/{args.cases:<2} {same_k:>3}/{args.cases:<2} {row[0]:>15.1f} {row[1]:>8.1f} "
              f"{row[2]:>11.1f} {row[3]:>8.1f} {row[4]:>14.1f} {row[5]:>8.1f} {counts[0]:>14} {counts[1]:>7}")

    print(f"\nthe walk (`accept` of the tree after its verify pass): tensor ops against one launch; GPU us per graph "
          f"replay, and host-and-device us per eager call (as a DDTree round runs it)\n"
          f"{'budget':>6} {'graph: ops':>11} {'kernel':>8} {'eager: ops':>11} {'kernel':>8}")
    for budget, *us in walks:
        print(f"{budget:>6} {us[0]:>11.1f} {us[1]:>8.1f} {us[2]:>11.1f} {us[3]:>8.1f}")


def walk_us(tree: trees.Proposal, vocab: int, dev: torch.device,
            gen: torch.Generator) -> tuple[float, float, float, float]:
    """`accept` of `tree` under picks that follow it to some depth, with the tensor ops and with the kernel: GPU us per
    graph replay of each, then us per eager call (each call's launches and the device's work, synchronised every
    100 calls), after checking both give the same walk."""
    picked = torch.randint(0, vocab, (tree.size + 1,), device=dev, generator=gen)
    picked[tree.parents[:4]] = tree.tokens[:4]  # the first nodes drew their own tokens
    ops, kernel = verify.accept(tree, picked), verify.accept(tree, picked, kernel=True)
    if not all(torch.equal(a, b) for a, b in zip(ops, kernel)):
        raise SystemExit(f"the walk kernel and the tensor ops differ on a tree of {tree.size} nodes")
    out = [1e3 * device_ms(Graphed(lambda on=on: verify.accept(tree, picked, kernel=on)), dev, n=50) for on in (False, True)]
    for on in (False, True):
        for _ in range(10):
            verify.accept(tree, picked, kernel=on)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            verify.accept(tree, picked, kernel=on)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e4)
    return out[0], out[1], out[2], out[3]


if __name__ == "__main__":
    main()
