"""CUDA variants of the engine checks (run on the GPU machine; skipped without CUDA).

fp32 on CUDA must be exactly lossless. In bf16, verifying k tokens in one pass and decoding one
at a time round differently, so greedy paths may split at near-ties: every divergence must be at
a position where the target's own top-2 logits (in fp32) are within `NEAR_TIE` of each other.
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo

import whiflash
from whiflash.routers import ScriptedRouter
from whiflash.runtime import decode_attention, layers

pytestmark = pytest.mark.gpu
PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6]]
NEAR_TIE = 0.15  # logit units; bf16 carries ~3 significant digits on logits of magnitude ~10


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("world", ["qwen3-random", "llama-random", "qwen3-crafted", "llama-mixed"])
def test_cuda_fp32_is_exactly_lossless(worlds, world):
    target, drafters = worlds[world].load(device="cuda")
    for prompt in PROMPTS:
        ref, _ = whiflash.generate(target, None, prompt, 40)
        for kind, drafter in drafters.items():
            assert whiflash.generate(target, drafter, prompt, 40)[0] == ref, (world, kind, prompt)


def _margin(fp32_target, prefix: list[int], a: int, b: int) -> float:
    fp32_target.setup_cache(len(prefix) + 1)
    logits = fp32_target(torch.tensor(prefix, device=fp32_target.device), 0, logits="last").logits[-1]
    return float((logits[a] - logits[b]).abs())


@pytest.mark.parametrize("world", ["qwen3-random", "llama-random", "qwen3-crafted", "llama-crafted", "qwen3-mixed", "llama-mixed"])
def test_cuda_bf16_diverges_only_at_near_ties(worlds, world, record_property):
    target, drafters = worlds[world].load(device="cuda", dtype=torch.bfloat16)
    fp32, _ = worlds[world].load(device="cuda")
    divergences = []
    for prompt in PROMPTS:
        ref, _ = whiflash.generate(target, None, prompt, 40)
        for kind, drafter in drafters.items():
            out, _ = whiflash.generate(target, drafter, prompt, 40)
            if out == ref:
                continue
            i = next(j for j, (x, y) in enumerate(zip(out, ref)) if x != y)
            margin = _margin(fp32, prompt + ref[:i], out[i], ref[i])
            divergences.append((kind, prompt, i, margin))
            assert margin < NEAR_TIE, f"{world} {kind}: diverged at {i} with fp32 margin {margin:.3f}"
    record_property("divergences", divergences)
    print(f"{world}: {len(divergences)} near-tie divergences {divergences}")


@pytest.fixture(params=["decode-kernel", "sdpa", "compiled", "compiled+gemv"])
def engine(request):
    """The fixed-shape passes' options: the decode attention kernel (the default), SDPA, the kernel with
    torch.compile'd layer stages, and those with the GEMV kernel (on by default). Compiled code starts afresh
    for every test: a run compiles for its one target and drafters, this file for a dozen worlds and dtypes,
    whose variants together would pass dynamo's recompile limit."""
    torch._dynamo.reset()
    return whiflash.EngineOptions.from_environment(attention_kernel=request.param != "sdpa",
                                                   compiled_layers=request.param.startswith("compiled"),
                                                   gemv=request.param.endswith("gemv"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["qwen3-mixed", "qwen3-random"])  # random: drafters that attend to their caches
def test_cuda_graphs_decode_like_the_eager_path(worlds, dtype, name, engine):
    world = worlds[name]
    target, drafters = world.load(device="cuda", dtype=dtype)
    routed = whiflash.RoutedDrafter("df-e3", whiflash.AlternatingRouter(), eagle3=drafters["eagle3"],
                                    dflash=drafters["ddtree"])
    # long stretches per drafter: lazy backlogs that take several fixed-shape catch-up passes
    stretches = whiflash.RoutedDrafter("df-e3", ScriptedRouter([0] * 6 + [1] * 5), eagle3=drafters["eagle3"],
                                       dflash=drafters["dflash"])
    oracle = whiflash.OracleDrafter("df-e3", eagle3=drafters["eagle3"], dflash=drafters["dflash"])
    methods = [None, *drafters.values(), routed, stretches, oracle]
    fp32, _ = world.load(device="cuda")
    for prompt in PROMPTS:
        target.set_engine(engine)  # the drafters take it when they attach
        eager = [whiflash.generate(target, d, prompt, 40)[0] for d in methods]
        target.set_engine(engine.with_(cuda_graphs=True))
        graphed = [whiflash.generate(target, d, prompt, 40)[0] for d in methods]
        target.set_engine(engine)
        for a, b in zip(eager, graphed):
            if a != b:  # bf16 only: a full-cache reduction may round a near-tie the other way
                assert dtype == torch.bfloat16
                i = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
                assert _margin(fp32, prompt + a[:i], a[i], b[i]) < NEAR_TIE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_kernel_matches_sdpa_at_real_shapes(dtype):
    """Qwen3-8B's heads (32 query, 8 K/V, head dim 128) over a 1,300-slot cache, chains and trees up to the
    longest block the kernel takes (DDTree's budget 128)."""
    torch.manual_seed(0)
    slots, ctx = 1300, 1000
    k = torch.randn(8, slots, 128, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    k[:, ctx + decode_attention.MAX_QUERIES + 8:] = float("nan")  # slots no row may see are never read
    for t in (1, 7, 16, 33, 64, 65, decode_attention.MAX_QUERIES):
        q = torch.randn(32, t, 128, device="cuda", dtype=dtype)
        mask = torch.zeros(t, slots, dtype=torch.bool, device="cuda")
        mask[:, :ctx] = True
        block = torch.rand(t, t, device="cuda") < 0.3
        mask[:, ctx:ctx + t] = (block | torch.eye(t, dtype=torch.bool, device="cuda")).tril()
        assert decode_attention.usable(q, k, mask)
        got = decode_attention.masked_attention(q, k, v, mask)
        want = layers.attention(q, k.nan_to_num(), v, mask, fixed_shape=True, kernel=False)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_cuda_matches_transformers(worlds):
    from transformers import AutoModelForCausalLM

    world = worlds["llama-random"]
    ref = AutoModelForCausalLM.from_pretrained(world.target_dir, dtype=torch.float32).cuda().eval()
    ours = whiflash.load_target(world.target_dir, device="cuda")
    ids = torch.arange(1, 30, device="cuda")
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
    ours.setup_cache(32)
    torch.testing.assert_close(ours(ids, 0).logits, expected, atol=1e-4, rtol=1e-4)


def test_a_captured_verify_pass_routes_as_the_eager_one(worlds):
    """A policy deciding inside the verify pass: with CUDA graphs the same slots as eager (fp32), AR's output,
    and a threshold changed after capture is the one a replay decides with (the pass is keyed by it)."""
    from whiflash.router import NeuralRouter

    target, drafters = worlds["qwen3-random"].load(device="cuda")
    torch.manual_seed(0)
    router = NeuralRouter(target.config.hidden_size, mlp_dim=16).cuda()
    target.setup_cache(64)
    scores = whiflash.NeuralPolicy(router).score(target(torch.tensor(PROMPTS[2] * 3, device="cuda"), 0).hidden).sort().values
    policy = whiflash.NeuralPolicy(router)
    engine = target.engine.with_(cuda_graphs=False)
    slots = []  # per threshold: the eager slots of every prompt (they must differ, or the check proves nothing)
    for threshold in (float(scores[len(scores) // 2]), float(scores[len(scores) // 4])):
        slots.append([])
        policy.threshold = threshold
        routed = whiflash.RoutedDrafter("df-e3", policy, eagle3=drafters["eagle3"], dflash=drafters["dflash"])
        for prompt in PROMPTS:
            ref, _ = whiflash.generate(target, None, prompt, 40)
            runs = []
            for graphs in (False, True):
                target.set_engine(engine.with_(cuda_graphs=graphs))
                runs.append(whiflash.generate(target, routed, prompt, 40))
            target.set_engine(engine)
            (a, sa), (b, sb) = runs
            assert a == b == ref and sa.slots == sb.slots, (threshold, prompt)
            slots[-1].append(sa.slots)
    assert slots[0] != slots[1], "both thresholds routed alike: pick thresholds further apart"


def test_datagen_with_cuda_graphs_records_the_eager_rows(worlds, tmp_path):
    import json

    import numpy as np
    import pyarrow.parquet as pq

    from whiflash.datagen.cli import datagen

    world = worlds["qwen3-mixed"]
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "category": "math", "input_ids": p}) + "\n"
                               for i, p in enumerate(PROMPTS)))
    tables = []
    for graphs in (False, True):
        out = datagen(out=tmp_path / f"graphs-{graphs}", prompts=[str(prompts)], target=str(world.target_dir),
                      eagle3=str(world.eagle_dir), dflash=str(world.dflash_dir), max_new_tokens=30, device="cuda",
                      dtype="float32", cuda_graphs=graphs, compile_layers=False)  # graphs alone, in float32
        tables.append(pq.read_table(sorted(out.glob("shard-*.parquet"))).to_pandas())
    eager, graphed = tables
    assert len(eager) > 3
    for column in ("prompt_id", "round", "position", "tau_0", "tau_1", "active"):
        assert (eager[column] == graphed[column]).all()
    hidden = [torch.from_numpy(np.stack(t["hidden"].to_numpy()).astype(np.float32)) for t in tables]
    torch.testing.assert_close(hidden[0], hidden[1], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("world", ["qwen3-mixed", "llama-mixed"])
def test_a_batch_continued_under_a_graph_is_each_prompts_greedy_decode(worlds, world):
    """float32 on CUDA: the packed batch, its step replayed as a CUDA graph, emits every prompt's own greedy tokens."""
    from whiflash.decoding.greedy import greedy_batch

    target, _ = worlds[world].load(device="cuda")
    target.use_cuda_graphs(True)
    assert greedy_batch(target, PROMPTS, 40) == [whiflash.generate(target, None, p, 40)[0] for p in PROMPTS]


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("shed_span", [False, True])
def test_batched_generation_graph_replays_the_eager_decode(bf16, shed_span, caplog, monkeypatch):
    """The testbed generator's captured decode step gives the eager step's tokens (greedy and sampled), also
    where batches shed ended rows and the span of attended columns grows (a graph per batch size and span)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import whiflash.testbed.generate as generate
    from whiflash.testbed.generate import continue_prompts

    if shed_span:
        monkeypatch.setattr(generate, "SHED_MIN_ROWS", 2)
        monkeypatch.setattr(generate, "SPAN_CHUNK", 8)

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                      eos_token_id=1, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).cuda().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 97, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (9,), generator=g)]
    eos, batch = 1, 4
    if shed_span:  # an eos most of one batch's greedy rows reach within 8 steps, and a third of rows that do not
        more = [torch.randint(2, 97, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (64,), generator=g)]
        free = continue_prompts(model, more, 20, eos=-1, pad_id=0, batch_size=64, bf16=bf16)
        eos = max(range(2, 97), key=lambda t: sum(t in row[:8] for row in free))
        hit = [p for p, row in zip(more, free) if eos in row[:8]]
        miss = [p for p, row in zip(more, free) if eos not in row[:8]]
        prompts = hit + miss[:len(hit) // 2]
        batch = len(prompts)
    with caplog.at_level(logging.DEBUG, logger="whiflash.testbed.generate"):
        for temperature in (0.0, 1.0):
            runs = [continue_prompts(model, prompts, 20, eos=eos, pad_id=0, batch_size=batch, temperature=temperature,
                                     seed=3, bf16=bf16, cuda_graphs=graphs) for graphs in (False, True)]
            assert runs[0] == runs[1], temperature
    assert "capture failed" not in caplog.text  # the graph ran: no batch fell back to the eager step
    assert ("shedding the rest" in caplog.text) == shed_span


def test_one_off_work_counts_the_graphs_a_decode_captures(worlds):
    """`one_off_work()`, which the bench reads around every timed decode: the first graphed decode captures the
    passes it runs, the same decode again only replays them."""
    from whiflash.runtime.graphs import one_off_work

    target, drafters = worlds["qwen3-mixed"].load(device="cuda")
    target.set_engine(target.engine.with_(cuda_graphs=True))
    captured = []
    for _ in range(2):
        before = one_off_work()["graphs_captured"]
        whiflash.generate(target, drafters["dflash"], PROMPTS[1], 40)
        captured.append(one_off_work()["graphs_captured"] - before)
    assert captured[0] > 0 and captured[1] == 0
