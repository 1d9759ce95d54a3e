"""The fixed-shape passes' speed options on the CPU: the Triton decode attention, GEMV and DDTree beam kernels
(under Triton's interpreter) and the torch.compile'd layer stages. Both must leave decoding unchanged; CUDA runs of
the same checks are in tests/test_gpu.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import whiflash
from whiflash.runtime import decode_attention, layers

needs_triton = pytest.mark.skipif(decode_attention.triton is None, reason="triton is not installed")


def _interpreted(code: str, timeout: int = 300) -> str:
    """Run `code` in a fresh Python with Triton's interpreter on (it is read when kernels are defined)."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@needs_triton
def test_kernel_computes_masked_attention_and_skips_unseen_tiles() -> None:
    out = _interpreted("""
        import torch
        from whiflash.runtime import decode_attention as da

        def reference(q, k, v, mask):
            g = q.shape[0] // k.shape[0]
            s = q.double() @ k.double().repeat_interleave(g, 0).transpose(1, 2) / q.shape[-1] ** 0.5
            p = s.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)
            return p @ v.double().repeat_interleave(g, 0)

        torch.manual_seed(0)
        # (query heads, K/V heads, rows, head dim, slots): GQA groups 1/2/4, head dims below 16 and not
        # powers of two, more rows than one row block, caches of one tile and of 9 splits of 2 tiles each;
        # a tree verify of DDTree's budget 128 (129 queries, the most the kernel takes)
        shapes = [(4, 2, 1, 64, 300), (8, 2, 5, 8, 200), (4, 4, 17, 24, 130), (4, 1, 33, 64, 64),
                  (8, 4, 16, 32, 1100), (4, 2, da.MAX_QUERIES, 16, 400)]
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
            # fp16 skips the MAX_QUERIES case (~7 s interpreted; its row blocks are those of the fp32 case)
            for hq, hkv, t, d, slots in shapes[:-1] if dtype == torch.float16 else shapes:
                q = torch.randn(t, hq, d).to(dtype).transpose(0, 1)  # a strided query, as attention gets it
                k, v = torch.randn(2, hkv, slots, d).to(dtype)
                start = slots - t - 3 if slots > 300 else slots - t
                tree = (torch.rand(t, t) < 0.4) | torch.eye(t, dtype=torch.bool)
                mask = torch.zeros(t, slots, dtype=torch.bool)
                mask[:, :start] = True
                mask[:, start:start + t] = tree.tril()
                if t > 3:
                    mask[2] = False  # a row that sees nothing gets zeros
                if slots > 300:  # whole tiles no row may see hold NaN: they must not be read
                    mask[:, 64:192] = False
                    k[:, 64:192] = v[:, 64:192] = float("nan")
                got = da.masked_attention(q, k, v, mask)
                assert got.shape == q.shape and got.dtype == dtype
                err = (got.double() - reference(q, k.nan_to_num(), v.nan_to_num(), mask)).abs().max().item()
                assert err < tol, (dtype, hq, hkv, t, d, slots, err)
        # an expanded mask (stride 0 over rows), as DFlash's block pass builds it
        q, k, v = torch.randn(4, 8, 16), torch.randn(2, 100, 16), torch.randn(2, 100, 16)
        mask = (torch.arange(100) < 60).expand(8, -1)
        err = (da.masked_attention(q, k, v, mask).double() - reference(q, k, v, mask)).abs().max().item()
        assert err < 1e-5, err
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_triton
def test_fixed_shape_decoding_with_the_kernel_equals_the_eager_path(tmp_path) -> None:
    """Every method, fixed-shape passes attending through the kernel, against the eager path (SDPA). The
    products stay with PyTorch here (interpreted, the GEMV kernel would double the test's time; the GEMV test
    decodes with both kernels)."""
    out = _interpreted(f"""
        import json
        from pathlib import Path

        import torch
        import whiflash
        from whiflash.runtime import decode_attention as da, gemv
        from whiflash.testing import make_dflash, make_eagle3, make_target

        root = Path({str(tmp_path)!r})
        target_dir = make_target(root / "target", "qwen3", crafted=True, mix=0.1, seed=4)
        cfg = json.loads((target_dir / "config.json").read_text())
        target = whiflash.load_target(target_dir)
        target.set_engine(target.engine.with_(gemv=False))  # the drafters take it when they attach
        drafters = [whiflash.load_drafter("eagle3", make_eagle3(root / "e3", cfg, [0, 1, 2], draft_vocab=24,
                                                                crafted=True), target, num_steps=4)]
        dflash_dir = make_dflash(root / "df", cfg, [0, 1, 3], block_size=8, crafted=True)
        drafters += [whiflash.load_drafter("dflash", dflash_dir, target),
                     whiflash.load_drafter("ddtree", dflash_dir, target, tree_budget=12)]
        calls = [0]
        real = da._masked_attention
        da._masked_attention = lambda *a: (calls.__setitem__(0, calls[0] + 1), real(*a))[1]
        prompt = [1, 5, 7, 9, 11, 3]
        ar = whiflash.generate(target, None, prompt, 10)[0]
        for drafter in [None, *drafters]:
            eager = whiflash.generate(target, drafter, prompt, 10)  # several rounds each (interpreted: 1-2 s a round)
            for m in [target, *drafters]:
                m.static = True
            fixed = whiflash.generate(target, drafter, prompt, 10)
            for m in [target, *drafters]:
                m.static = False
            assert eager[0] == fixed[0] and eager[1].taus == fixed[1].taus, drafter
            assert eager[0] == ar, drafter  # DDTree's top-k, tree and walk kernels included: lossless
        assert calls[0] > 60, calls
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_triton
def test_gemv_kernel_matches_linear_and_decodes_alike(tmp_path) -> None:
    """The GEMV kernel: products of 1-16 rows (bias or not, widths not multiples of its blocks)
    against float64, then whole fixed-shape decodes with it on against eager decodes with it off."""
    out = _interpreted(f"""
        import json
        from pathlib import Path

        import torch
        import whiflash
        from whiflash.runtime import gemv
        from whiflash.testing import make_dflash, make_eagle3, make_target

        torch.manual_seed(0)
        for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 2e-2)):
            for rows, n, k, bias in ((1, 40, 600, False), (7, 16, 512, True), (16, 100, 64, True)):
                x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
                b = torch.randn(n).to(dtype) if bias else None
                want = x.double() @ w.double().T + (b.double() if bias else 0)
                err = (gemv.gemv(x, w, b).double() - want).abs().max().item()
                assert err < tol * k ** 0.5, (dtype, rows, n, k, err)
                # with the residual add folded in: bit for bit what the separate add gives
                r = torch.randn(rows, n).to(dtype)
                assert torch.equal(gemv.gemv(x, w, b, residual=r), r + gemv.gemv(x, w, b)), (dtype, rows, n, k)
                # K split over 3 programs a strip: as close, the same on every call, counters left at zero
                split_table = {{(n, k): (16, 128, 3, 4, 3)}}
                split = gemv.gemv(x, w, b, residual=r, table=split_table)
                assert (split.double() - want - r.double()).abs().max().item() < 2 * tol * k ** 0.5, (dtype, n, k)
                assert torch.equal(split, gemv.gemv(x, w, b, residual=r, table=split_table))
                assert not gemv.counters(x.device, 1).any()
        table = gemv.CONFIGS
        assert not gemv.usable(torch.randn(17, 8), torch.randn(4, 8), table)  # more rows than its tile
        assert not gemv.usable(torch.randn(1, 8), torch.randn(16, 8), table)  # a widening product stays with cuBLAS
        assert gemv.usable(torch.randn(1, 8), torch.randn(8, 8), table)
        assert gemv.usable(torch.randn(2, 16), torch.randn(8, 16), table)
        assert not gemv.usable(torch.randn(1, 8), torch.randn(8, 8), None)  # EngineOptions(gemv=False)
        assert gemv.usable(torch.randn(1, 8), torch.randn(16, 8), {{(16, 8): (16, 128, 1, 4, 3)}})  # a measured setting

        root = Path({str(tmp_path)!r})
        target_dir = make_target(root / "target", "llama", crafted=True, mix=0.1, seed=5)
        cfg = json.loads((target_dir / "config.json").read_text())
        target = whiflash.load_target(target_dir)
        eagle = whiflash.load_drafter("eagle3", make_eagle3(root / "e3", cfg, [0, 1, 2], draft_vocab=24, crafted=True),
                                      target, num_steps=4)
        dflash = whiflash.load_drafter("dflash", make_dflash(root / "df", cfg, [0, 1, 3], block_size=8, crafted=True),
                                       target)
        calls = [0]
        real = gemv._gemv_op
        gemv._gemv_op = lambda *a: (calls.__setitem__(0, calls[0] + 1), real(*a))[1]
        on = target.engine
        for drafter in (eagle, dflash):
            target.set_engine(on.with_(gemv=False))  # the reference: cuBLAS's products, eager passes
            reference = whiflash.generate(target, drafter, [3, 1, 4, 1, 5], 8)
            target.set_engine(on)
            for m in (target, eagle, dflash):
                m.static = True
            fixed = whiflash.generate(target, drafter, [3, 1, 4, 1, 5], 8)
            for m in (target, eagle, dflash):
                m.static = False
            assert reference[0] == fixed[0] and reference[1].taus == fixed[1].taus, drafter
        assert calls[0] > 50, calls
        print("ok")
    """)
    assert out.strip() == "ok"


def test_kernel_is_only_used_where_it_can_run() -> None:
    q, k = torch.randn(4, 3, 16), torch.randn(2, 50, 16)
    mask = torch.ones(3, 50, dtype=torch.bool)
    if not decode_attention.INTERPRET:
        assert not decode_attention.usable(q, k, mask)  # CPU tensors: SDPA
    assert not decode_attention.usable(q, k, None)
    assert not decode_attention.usable(q, k, torch.zeros(3, 50))  # an additive float mask means the opposite
    assert not decode_attention.usable(torch.randn(4, decode_attention.MAX_QUERIES + 1, 16), k,
                                       torch.ones(decode_attention.MAX_QUERIES + 1, 50, dtype=torch.bool))


def test_compiled_layer_stages_decode_alike_and_compile_once_per_width(worlds, caplog) -> None:
    """torch.compile'd `pre`/`post` stages and drafter passes (backend aot_eager: dynamo's capture and AOT
    autograd's graphs, without code generation) give the same tokens, every pass compiles (none falls back
    to its uncompiled form), and the layer stages compile once per pass width and cache for all layers of
    the target and of DFlash (a layer's cache tensors are arguments of `pre`)."""
    from torch._dynamo.utils import counters

    target, drafters = worlds["qwen3-mixed"].load()
    prompt = [1, 5, 7, 9, 11, 3]
    eager = {k: whiflash.generate(target, d, prompt, 24) for k, d in drafters.items()}
    members = [target, *drafters.values()]
    torch._dynamo.reset()
    counters.clear()
    before = target.engine
    target.set_engine(before.with_(compiled_layers=True, compile_backend="aot_eager"))  # drafters follow at reset
    try:
        for m in members:
            m.static = True
        fixed = {k: whiflash.generate(target, d, prompt, 24) for k, d in drafters.items()}
    finally:
        target.set_engine(before)
        for m in members:
            m.static = False
    for kind in eager:
        assert fixed[kind][0] == eager[kind][0] and fixed[kind][1].taus == eager[kind][1].taus, kind
    assert "torch.compile failed" not in caplog.text
    # widths: EAGLE-3 verify 5, DFlash verify/block 8, DDTree verify 13 -> `pre` for the 3 target widths and
    # DFlash's block over its own cache, `post` for the 3 widths: 7, not one per layer (2 target layers +
    # DFlash's); then the drafters' own passes: EAGLE-3's steps and its catch-up at both widths (the prompt
    # takes a 4x pass), the context pass of the DFlash and DDTree drafters (two types): 12, and none twice
    # (a rotary table built inside a trace used to cost a recompile)
    assert 0 < counters["stats"]["unique_graphs"] <= 12, dict(counters["stats"])


def test_compile_refuses_where_it_cannot_run(worlds, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    target, _ = worlds["qwen3-mixed"].load()
    before = target.engine
    with pytest.raises(RuntimeError, match="--compile-layers: torch.compile does not run"):
        target.set_engine(before.with_(compiled_layers=True, compile_backend="refused"))
    assert target.engine is before and not target.engine.compiled_layers


def test_a_pass_that_does_not_compile_warns_once_and_runs_uncompiled(caplog) -> None:
    def data_dependent(x: torch.Tensor) -> torch.Tensor:  # a host read: no single graph
        return x * 2 if x.sum().item() > 0 else x

    run = layers.compile_pass(data_dependent, backend="aot_eager")
    x = torch.ones(3)
    assert torch.equal(run(x), x * 2) and torch.equal(run(-x), -x)
    assert caplog.text.count("torch.compile failed on") == 1, caplog.text


def test_gemv_settings_file(tmp_path) -> None:
    """`scripts/bench_gemv.py --json` files load into the setting table; a bad one names itself and the form."""
    from whiflash.runtime import gemv

    from whiflash.runtime.options import EngineOptions

    good = tmp_path / "gemv.json"
    good.write_text('{"24x8": [16, 128, 2, 4, 3]}')
    table = gemv.table_for(EngineOptions(gemv_configs=str(good)))
    assert gemv.config(24, 8, table) == (16, 128, 2, 4, 3)
    assert all(table[key] == setting for key, setting in gemv.CONFIGS.items())  # added to the built-in table
    assert gemv.table_for(EngineOptions(gemv=False, gemv_configs=str(good))) is None  # off: cuBLAS only
    for text in ('{"24-8": [16, 128, 2, 4, 3]}', '[1, 2]', '{"24x8": 3}', '{"24x8": [16, 128]}'):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=r"bad\.json: expected a JSON object of \"NxK\""):
            gemv.read_configs(bad)
    assert (24, 8) not in gemv.CONFIGS
    with pytest.raises(ValueError, match="missing.json"):
        gemv.table_for(EngineOptions(gemv_configs=str(tmp_path / "missing.json")))


def test_gemv_counters_grow_beside_the_old_ones() -> None:
    """Split-K counters that must grow are added, never swapped in: captured graphs read the old ones."""
    from whiflash.runtime import gemv

    cpu = torch.device("cpu")
    first = gemv.counters(cpu, 1)
    assert gemv.counters(cpu, first.numel()) is first
    bigger = gemv.counters(cpu, first.numel() + 1)
    assert bigger.numel() > first.numel() and any(t is first for t in gemv._counters[cpu])


@needs_triton
def test_tree_kernel_builds_the_reference_trees() -> None:
    """DDTree's tree kernels (every candidate rank path scored and ranked at once, then parents and mask) against the
    sort-based tensor ops and the reference heap: ties between siblings, across depths and across tree rows where
    they decide the tree (`top3`: a kernel taking the later tied path instead of the earlier fails), exact
    zeros, -inf, bf16 scores, one and two depths, budgets up to the vocabulary (where the kernel runs), mask rows past
    one block of 16."""
    out = _interpreted("""
        import torch
        from whiflash.drafters import trees

        g = torch.Generator().manual_seed(0)
        cases = 0
        for kind in ["random", "tied", "gap40", "top3", "neginf", "bf16"]:
            for depth, vocab, budget in [(6, 64, 6), (5, 40, 15), (2, 64, 15), (1, 64, 6), (4, 20, 20), (3, 80, 32)]:
                x = torch.randn(depth, vocab, generator=g) * 2
                if kind == "tied":
                    x = torch.randint(0, 3, (depth, vocab), generator=g).float()
                elif kind == "gap40":  # top-1 log-prob exactly 0: children tie their parents
                    x[:, 0] += 40
                elif kind == "top3":  # three equal tokens far ahead: ties across beam rows inside the tree
                    x[:, :3] = 40.0
                elif kind == "neginf":
                    x[:, vocab // 2:] = float("-inf")
                top_logp, top_ids = torch.log_softmax(x, -1).topk(min(budget, vocab), -1)
                if kind == "bf16":
                    top_logp = top_logp.bfloat16()
                ops = trees.build_tree_device(top_logp, top_ids, budget, kernel=False)
                calls = []
                real = trees._tree_by_kernel
                trees._tree_by_kernel = lambda *a: (calls.append(1), real(*a))[1]
                kernel = trees.build_tree_device(top_logp, top_ids, budget)
                trees._tree_by_kernel = real
                assert calls, (kind, depth, budget)
                for field in ("tokens", "parents", "depths", "tree_mask"):
                    assert torch.equal(getattr(ops, field), getattr(kernel, field)), (kind, depth, budget, field)
                tokens, parents, depths = trees.build_tree(top_logp.tolist(), top_ids.tolist(), budget)
                assert (kernel.tokens.tolist(), kernel.parents.tolist(), kernel.depths.tolist()) == (
                    tokens, parents, depths), (kind, depth, budget)
                cases += 1
        print(cases)
    """)
    assert out.strip() == "36"


@needs_triton
def test_top_logp_kernel_picks_the_most_probable_tokens_in_order() -> None:
    """DDTree's top-k kernel against log-softmax and a stable sort (ties to the lower token id, which `topk` does not
    promise): integer-valued ties, -0.0 against +0.0, -inf tails, NaN read as -inf, bf16 logits, one row, budgets up
    to 32, a vocabulary that is not a power of two and one of a real testbed's size; then the whole proposal through
    it equals the tensor ops' on untied drafts."""
    out = _interpreted("""
        import torch
        from whiflash.drafters import trees

        g = torch.Generator().manual_seed(0)
        cases = 0
        for kind in ["random", "tied", "zeros", "neginf", "nan", "bf16"]:
            for depth, vocab, k in [(6, 64, 6), (5, 40, 15), (15, 8192, 15), (3, 80, 32), (1, 5000, 32)]:
                x = torch.randn(depth, vocab, generator=g) * 2
                if kind == "tied":
                    x = torch.randint(0, 3, (depth, vocab), generator=g).float()
                elif kind == "zeros":  # -0.0 and +0.0 tie (their keys must not order them)
                    sign = torch.randint(0, 2, (depth, vocab), generator=g).float() * 2 - 1
                    x = torch.randint(-1, 1, (depth, vocab), generator=g).float() * sign
                elif kind == "neginf":
                    x[:, vocab // 2:] = float("-inf")
                elif kind == "nan":
                    x[:, 1] = float("nan")
                elif kind == "bf16":
                    x = x.bfloat16()
                logp, ids = trees.top_logp(x, k)
                ref = torch.log_softmax(x.float().nan_to_num(nan=float("-inf")), -1)
                order = torch.sort(-ref, dim=-1, stable=True).indices[:, :k]
                assert torch.equal(ids, order), (kind, depth, vocab, k)
                assert logp.dtype == torch.float64
                assert torch.allclose(logp, ref.gather(1, order).double(), atol=1e-5, rtol=0), (kind, depth, k)
                cases += 1
        for depth, budget in ((15, 15), (6, 32)):  # (interpreted, depth 15 at budget 32 ranks 3,576 paths: ~55 s)
            x = torch.randn(depth, 1000, generator=g) * 3
            ops, kernel = (trees.tree_proposal(x, budget, kernel=on) for on in (False, True))
            for field in ("tokens", "parents", "depths", "tree_mask"):
                assert torch.equal(getattr(ops, field), getattr(kernel, field)), (budget, field)
            cases += 1
        print(cases)
    """)
    assert out.strip() == "32"


@needs_triton
def test_tree_walk_kernel_accepts_as_the_tensor_ops() -> None:
    """`accept`'s one-launch walk of a tree against its tensor ops: count, last node and the path-first permutation,
    on trees of 1 to 63 nodes (one and several blocks of 16 rows; padded trees where the vocabulary is smaller than
    the budget) under picks that follow the tree deep, stop at once or match nowhere, and a tie for the deepest
    accepted node (a padded tree's repeated first token: the lower index wins, as `argmax`)."""
    out = _interpreted("""
        import torch
        from whiflash.decoding import verify
        from whiflash.drafters import trees

        g = torch.Generator().manual_seed(0)
        cases = 0
        for budget in (1, 6, 15, 32, 63):
            for case in range(12):
                x = torch.randn(6, 12, generator=g) * (3 if case % 3 else 0.3)
                tree = trees.tree_proposal(x, budget, kernel=False)
                picked = torch.randint(0, 12, (tree.size + 1,), generator=g)
                if case % 2:  # most nodes drew their own token: deep paths, and ties in depth between branches
                    for i in range(tree.size):
                        if torch.rand(1, generator=g) < 0.7:
                            picked[tree.parents[i]] = tree.tokens[i]
                ops, kernel = verify.accept(tree, picked), verify.accept(tree, picked, kernel=True)
                for a, b in zip(ops, kernel):
                    assert a.dtype == b.dtype and torch.equal(a, b), (budget, case, a, b)
                cases += int(ops[0]) > 1
        # padded trees (20 prefixes of 2 depths of 4 tokens): the root's pick matches the best first token and its
        # repeats; token 4 is no draft token, so nothing deeper matches
        for budget in (32, 63):
            tree = trees.tree_proposal(torch.randn(2, 4, generator=g), budget, kernel=False)
            picked = torch.full((tree.size + 1,), 4)
            picked[0] = tree.tokens[0]
            ops, kernel = verify.accept(tree, picked), verify.accept(tree, picked, kernel=True)
            repeats = ((tree.tokens == tree.tokens[0]) & (tree.parents == 0)).sum()
            assert int(ops[1]) == 1 and repeats > 1, (ops, repeats)  # a tie at depth 1: the first node wins
            for a, b in zip(ops, kernel):
                assert torch.equal(a, b), (budget, a, b)
        print(cases)
    """)
    assert int(out) > 20  # enough of the walks went past the root


@needs_triton
def test_tree_kernels_compile_for_hopper() -> None:
    """The tree kernels compile for an H100 / H200 (sm_90) with the arguments a DDTree round launches them with: the
    interpreter runs their arithmetic, but only the compiler checks their types (a loop that changes the shape of
    a variable from before it compiles nowhere, yet interprets fine)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from whiflash.decoding import verify
    from whiflash.drafters import trees

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this triton has no NVIDIA backend")
    # the candidate table, RANK_OF and NODE_CAND are int32; N, L, K, B sizes
    types = dict(LOGP="*fp64", IDS="*i64", TOKENS="*i64", DEPTHS="*i64", PARENTS="*i64", MASK="*i8", N="i32",
                 L="i32", K="i32", B="i32", X="*bf16", V="i32", PICKED="*i64", OUT="*i64", KEEP="*i64", M="i32")
    for jit, launch in ((trees._tree_rank, dict(BLK=64, CH=128, LP=16)), (trees._tree_links, dict(NP=64)),
                        (trees._top_logp, dict(BV=8192)), (verify._tree_walk, dict(NP=64))):
        kernel = getattr(jit, "fn", jit)  # the Python function under the JIT wrapper
        signature = {name: "constexpr" if name in launch else types.get(name, "*i32")
                     for name in inspect.signature(kernel).parameters}
        compiled = triton.compile(ASTSource(jit, signature, launch), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4})
        assert f".entry {kernel.__name__}" in compiled.asm["ptx"]
