"""DDTree's device tree builder: the tree kernels (two launches) against the sort-based tensor ops, side by side.

Usage: python scripts/bench_tree.py [--budgets 15,32,64] [--depth 15] [--vocab 151936] [--cases 50]

For each budget, checks on `--cases` random and tied drafts that both builders give the same tree (tokens,
parents, depths, ancestor mask) from the same top-k, and that the top-k kernel picks what a stable sort of the
log-softmax picks (ties to the lower token id); then times each as one CUDA graph replay of `tree_proposal` (top-k
and builder, as a DDTree round runs it: log-softmax and `topk` with the sort-based builder, the top-k kernel with
the tree kernels), of the top-k alone and of the builder alone, in GPU us, and counts the builder's kernels.
"""
from __future__ import annotations

import argparse

import torch

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
        print(f"{budget:>6} {same:>7}/{args.cases:<2} {same_k:>3}/{args.cases:<2} {row[0]:>15.1f} {row[1]:>8.1f} "
              f"{row[2]:>11.1f} {row[3]:>8.1f} {row[4]:>14.1f} {row[5]:>8.1f} {counts[0]:>14} {counts[1]:>7}")


if __name__ == "__main__":
    main()
