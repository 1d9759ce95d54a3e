"""`whiflash-eval profile`: a latency profile of the loaded target and drafters on this device.

`profile_models` measures, at a committed context of `context` positions: the AR decode step, chain
verify at each drafter's width, tree verify at each DDTree budget, each drafter's draft, catch-up
per backlog length, and one routing decision of each router; it returns a `LatencyProfile` whose
`ratios()` is every component over the AR step. Models are used as loaded (a testbed, Hub ids,
or random weights at real shapes from `checkpoints/`). On CUDA the passes replay CUDA graphs and
are timed with CUDA events (GPU time); on the CPU they run eagerly, as `bench` runs them there,
and are timed with the wall clock.
"""
from __future__ import annotations

import logging
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import whiflash
from whiflash.decoding import prompt_room
from whiflash.decoding.verify import row
from whiflash.drafters import Commit, DDTreeDrafter, DFlashDrafter, Drafter, Eagle3Drafter
from whiflash.drafters.trees import ancestor_mask
from whiflash.engine import describe, engine_options, resolve_engine
from whiflash.folders import check_folder
from whiflash.locks import owning_folders
from whiflash.pairs import Pair
from whiflash.router import NeuralRouter
from whiflash.routers import EntropyRouter, NeuralPolicy, decides_in_pass
from whiflash.session import Session

from .checks import check_profile_config
from .config import BACKLOGS, ProfileConfig
from whiflash.latency import AFTER_PASS, LatencyProfile, catchup_model
from .methods import model_paths
from .outputs import check_output_file, device_info, prepare_run_dir, write_manifest
from .timing import copy_bandwidth, device_ms, sync, wall_ms

log = logging.getLogger(__name__)

__all__ = ["ProfileConfig", "floor_ms", "profile_models", "run_profile"]

def _ints(text: str | None, flag: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()] if text else []
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{flag}: expected integers >= 1, got {text!r}")
    return values


def _tree(nodes: int, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents, depths) of a DDTree-like shape of `nodes` nodes: a main chain as deep as the block
    allows, the rest first-level siblings (verify cost depends on the node count, not the shape)."""
    depth = min(max_depth, nodes)
    parents = list(range(depth)) + [0] * (nodes - depth)
    depths = list(range(1, depth + 1)) + [1] * (nodes - depth)
    return torch.tensor(parents), torch.tensor(depths)


@torch.no_grad()
def profile_models(target: Any, *, eagle3: Eagle3Drafter | None = None, dflash: DFlashDrafter | None = None,
                   tree_budgets: tuple[int, ...] | list[int] = (), neural: NeuralRouter | None = None,
                   context: int = 1024, backlogs: tuple[int, ...] | list[int] = BACKLOGS,
                   graphs: bool | None = None, repeats: int = 20, bandwidth: float | None = None,
                   loop_prompts: list[list[int]] | None = None, loop_new_tokens: int | None = None) -> LatencyProfile:
    """Time every component of decoding with these loaded models (see the module docstring).

    `dflash` also serves the DDTree rounds of `tree_budgets`. `graphs`: CUDA graphs (default: on
    a CUDA device). `bandwidth`: the device's copy bandwidth in bytes/s for the floor (default: measured
    now). `loop_prompts`: token ids the loop's rounds are timed on, `loop_new_tokens` each (`_loop_rounds`;
    default a random prompt; `loop_new_tokens` default 128 on prompts, 48 after the random one).
    The models' graph modes are restored afterwards; caches only grow.
    """
    device, cfg = target.device, target.config
    graphs = device.type == "cuda" if graphs is None else graphs and device.type == "cuda"
    drafters: dict[str, Drafter] = {k: d for k, d in (("eagle3", eagle3), ("dflash", dflash)) if d is not None}
    if tree_budgets and dflash is None:
        raise ValueError("tree budgets need the DFlash drafter (DDTree drafts with it)")
    widths = {k: d.draft_length + 1 for k, d in drafters.items()}
    nodes = {b: b + 1 for b in tree_budgets}
    spare = max([*widths.values(), *nodes.values(), *(4 * d.catch_up_rows for d in drafters.values()), 1])
    if max(backlogs, default=1) > context:
        raise ValueError(f"--backlogs: every backlog must fit in --context {context}, got {max(backlogs)}")
    if context + spare + 2 > cfg.max_position_embeddings:
        raise ValueError(f"--context {context}: the target has {cfg.max_position_embeddings} positions; "
                         f"give at most {cfg.max_position_embeddings - spare - 2}")
    max_len = context + spare + 2
    modes = [(m, m.graphs is not None) for m in (target, *drafters.values())]
    for m, _ in modes:
        m.use_cuda_graphs(graphs)
    timed = lambda fn: device_ms(fn, device, n=repeats)  # noqa: E731
    try:
        target.setup_cache(max_len)
        taps = tuple(sorted({t for d in drafters.values() for t in d.tap_layers}))
        ids = torch.randint(0, cfg.vocab_size, (spare + 1,), device=device)
        prof = LatencyProfile(ar_step=timed(lambda: target(ids[:1], context, logits="all")))
        prof.meta["ar_step_wall_ms"] = wall_ms(lambda: target(ids[:1], context, logits="all"), device, n=repeats)
        for w in sorted(set(widths.values())):
            prof.verify[w] = timed(lambda w=w: target(ids[:w], context, None, None, taps, logits="all"))
        block = dflash.block_size - 1 if dflash is not None else 1
        for b, w in nodes.items():
            parents, depths = _tree(b, block)
            mask = ancestor_mask(parents).to(device)
            pos = context + torch.cat([torch.zeros(1, dtype=torch.long), depths]).to(device)
            prof.tree_verify[w] = timed(lambda w=w, pos=pos, mask=mask: target(ids[:w], context, pos, mask, taps,
                                                                                 logits="all"))

        def commit(start: int, n: int) -> Commit:
            feats = torch.randn(n, len(taps), cfg.hidden_size, device=device, dtype=target.dtype)
            return Commit(feats, torch.randint(0, cfg.vocab_size, (n,), device=device), start, taps)

        pending = ids[:1]
        for kind, d in drafters.items():
            d.reset(target, max_len)
            d.observe(commit(0, context))
            d.catch_up()
            prof.draft[kind] = timed(lambda d=d: d.draft(pending, context))
            prof.round[kind] = prof.draft[kind] + prof.verify[widths[kind]]
            prof.catchup[kind] = {n: timed(lambda d=d, n=n, c=commit(context - n, n): _catch_up(d, c))
                                  for n in backlogs}
        for b, w in nodes.items():
            key = f"ddtree-b{b}"
            prof.draft[key] = timed(lambda b=b: dflash.draft(pending, context, b))
            prof.round[key] = prof.draft[key] + prof.tree_verify[w]
        prof.router.update(_router_ms(target, neural, timed, ids[: max(widths.values(), default=1)], context, taps))
        sync(device)
        new_tokens = loop_new_tokens if loop_new_tokens is not None else 128 if loop_prompts else 48
        loop, routed, decision = _loop_rounds(target, drafters, context, new_tokens,
                                              neural=neural, tree_budgets=tree_budgets,
                                              repeats=3 if loop_prompts else 5, prompts=loop_prompts)
        prof.meta["loop_round_wall_ms"], prof.meta["loop_host_ms"] = loop, host_ms(prof, loop)
        prof.meta["loop_prompts"] = len(loop_prompts) if loop_prompts else 0  # 0: after a random prompt
        prof.meta["loop_new_tokens"] = new_tokens
        if routed:  # and what those rounds paid for their decisions (LatencyProfile.routed_extra_ms leaves it out)
            prof.meta["loop_routed_round_wall_ms"], prof.meta["loop_routed_decision"] = routed, decision
        prof.floor = floor_ms(target, context, bandwidth)
    finally:
        for m, was in modes:
            m.use_cuda_graphs(was)
    prof.meta.update({"device": str(device), "dtype": str(target.dtype).removeprefix("torch."),
                      "timing": "cuda-events (GPU time)" if device.type == "cuda" else "wall-clock",
                      "cuda_graphs": graphs, "context": context, "compiled_layers": target.engine.compiled_layers,
                      "widths": {**widths, **{f"ddtree-b{b}": w for b, w in nodes.items()}}})
    if device.type == "cuda":
        prof.meta["device_name"] = torch.cuda.get_device_name(device)
    return prof


def _loop_rounds(target: Any, drafters: dict[str, Drafter], context: int, new_tokens: int = 48,
                 neural: NeuralRouter | None = None, tree_budgets: tuple[int, ...] | list[int] = (),
                 repeats: int = 5, prompts: list[list[int]] | None = None
                 ) -> tuple[dict[str, float], dict[str, float], str | None]:
    """Wall milliseconds a round of the real loop (`whiflash.generate`) takes after a random prompt of `context`
    tokens (rounds then commit about one token each), or with `prompts` over real decodes of them
    (`new_tokens` each, each prompt's last `context` tokens at most; a method's decode time over all of its
    rounds): AR, each chain drafter alone and DDTree at each of
    `tree_budgets` (`ddtree-bN`, on the DFlash drafter's weights: its tree, acceptance walk and cache compaction
    dispatch work that DFlash's round does not, so it pays a host share of its own), then (with both drafters)
    each of them as a slot of a df-e3 routed drafter whose neural policy always picks that slot. Beside the
    components' device times the first is what the host adds to a round (launches outside captured passes, the
    round's one read); the second what routing adds to that slot's round (the pair's taps in the verify pass,
    the in-pass decision, the other member's backlog), which the bench pays and the components do not show.
    Each figure is the median of `repeats` decodes (passes over `prompts`), the methods interleaved in an order that
    turns every repeat, so neither drift nor going second favours a routed slot against its drafter alone. The third value
    names the decision the routed rounds made every round (a `router` key of the profile; None without them)."""
    methods: dict[str, Drafter | None] = {"ar": None, **drafters}
    if "dflash" in drafters:
        methods.update({f"ddtree-b{b}": DDTreeDrafter.over(drafters["dflash"], b) for b in tree_budgets})
    nodes = max([d.max_nodes for d in methods.values() if d is not None] + [0])
    if prompts:
        room = min(context, prompt_room(target, new_tokens, nodes))
        decoded = [p[-room:] for p in prompts]
    else:
        new_tokens = max(2, min(new_tokens, target.config.max_position_embeddings - context - 2 * nodes - 2))
        decoded = [torch.randint(0, target.config.vocab_size, (context,)).tolist()]
    decision = None
    if "eagle3" in drafters and "dflash" in drafters:
        # the given router where it is df-e3's (its context decides whether it routes inside the pass), else
        # random weights, which cost the same
        router = neural if neural is not None and str(neural.pair) == "df-e3" else \
            NeuralRouter(target.config.hidden_size).to(target.device).eval()
        decision = "neural" if decides_in_pass(router) else AFTER_PASS
        for slot, kind in enumerate(Pair.parse("df-e3").slots):  # a finite threshold decides every round
            policy = NeuralPolicy(router, -1e30 if slot == 0 else 1e30)
            methods[f"routed:{kind}"] = whiflash.RoutedDrafter("df-e3", policy, eagle3=drafters["eagle3"],
                                                               dflash=drafters["dflash"])
    longest = max(decoded, key=len)
    for drafter in methods.values():  # captures the graphs of this cache size
        whiflash.generate(target, drafter, longest, new_tokens)
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            runs = [whiflash.generate(target, methods[name], p, new_tokens)[1] for p in decoded]
            times[name].append(sum(st.decode_seconds for st in runs) / max(1, sum(st.rounds for st in runs)) * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    alone = {k: v for k, v in ms.items() if not k.startswith("routed:")}
    routed = {k.removeprefix("routed:"): v for k, v in ms.items() if k.startswith("routed:")}
    return alone, routed, decision


def host_ms(prof: LatencyProfile, loop: dict[str, float]) -> dict[str, float]:
    """What the host adds to a round of the loop, per kind of `loop` (`_loop_rounds`' wall ms): the wall time
    minus the round's components, `ar_step` for AR, else `round` + the smallest backlog's catch-up (a round after
    a random prompt commits about one token, which the drafter catches up on); never below 0."""
    def parts(kind: str) -> float:
        if kind == "ar":
            return prof.ar_step
        catchup = prof.catchup.get(catchup_model(kind)) or {}  # DDTree catches up with the DFlash model
        return prof.round[kind] + (catchup[min(catchup)] if catchup else 0.0)

    return {kind: max(0.0, ms - parts(kind)) for kind, ms in loop.items()}


def _catch_up(drafter: Drafter, backlog: Commit) -> None:
    """One catch-up of `backlog` (rows just before the pending position): the cache is rewound first."""
    drafter.kv_len = backlog.start
    drafter.observe(backlog)
    drafter.catch_up()


AFTER_PASS_HISTORY = 2
"""The history of the router whose after-pass decision the profile times (`whiflash-train`'s `hN` variants)."""


def _router_ms(target: Any, neural: NeuralRouter | None, timed: Any, ids: Tensor, context: int,
               taps: tuple[int, ...]) -> dict[str, float]:
    """One decision of the entropy router, of a neural router (random weights cost the same) and of one that
    decides after the pass (`AFTER_PASS`), as the routed loop pays it: a policy that decides inside the verify
    pass costs what it adds to a verify of `ids` (and picking the path's last row; never below 0); one that
    reads the previous round or earlier positions, its own calls."""
    cfg, device = target.config, target.device
    neural = neural if neural is not None else NeuralRouter(cfg.hidden_size).to(device).eval()
    plain = timed(lambda: target(ids, context, None, None, taps, logits="all"))
    last = torch.zeros((), dtype=torch.long, device=device)
    hidden = torch.randn(cfg.hidden_size, device=device, dtype=target.dtype)
    logits = torch.randn(cfg.vocab_size, device=device)
    out = {}
    for name, policy in (("entropy", EntropyRouter()), ("neural", NeuralPolicy(neural))):
        if policy.rows_key is None:
            out[name] = timed(lambda p=policy: p(hidden, logits))
            continue
        routed = timed(lambda p=policy: row(target(ids, context, None, None, taps, logits="all", route=p).routes, last))
        out[name] = max(0.0, routed - plain)
    # a router that reads earlier positions decides after the pass: what `RoutedDrafter.route` runs each round
    # (keep the verified path's states, then score), launched from the host between two captured passes
    after = NeuralPolicy(NeuralRouter(cfg.hidden_size, history=AFTER_PASS_HISTORY).to(device).eval())
    rows = torch.randn(ids.shape[0], cfg.hidden_size, device=device, dtype=target.dtype)
    keep = torch.arange(ids.shape[0], device=device)
    count = torch.ones((), dtype=torch.long, device=device)
    after(hidden, logits)  # the sequence's first decision starts its history

    def decide() -> Tensor:
        after.observe(rows, keep, count)
        after.after_round(0, count)
        return after(hidden, logits)

    out[AFTER_PASS] = timed(decide)
    return out


def floor_ms(target: Any, context: int, bandwidth: float | None = None) -> float:
    """(weight bytes + KV bytes at `context`) / copy bandwidth (`bandwidth` bytes/s, or measured now):
    no AR step can be faster at batch 1."""
    cfg = target.config
    size = target.lm_head.weight.element_size()
    weights = sum(p.numel() for n, p in target.named_parameters() if "embed_tokens" not in n
                  or cfg.tie_word_embeddings) * size  # the embedding is a gather, not a full read
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * context * cfg.head_dim * size
    return (weights + kv) / (bandwidth or copy_bandwidth(target.device)) * 1e3


def _load(cfg: ProfileConfig) -> tuple[Any, Eagle3Drafter | None, DFlashDrafter | None, dict[str, Any],
                                       Session | None]:
    """Target, EAGLE-3 and DFlash drafters (either may be None), a record of where they came from, and the
    session that opened them (None for random weights)."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.random_weights:
        from .shapes import random_models

        if not cfg.preset:
            raise ValueError("--random-weights needs --preset NAME: the shapes come from checkpoints/<preset>/")
        target, eagle, dflash = random_models(cfg.preset, cfg.device, dtype, toy=cfg.toy_widths,
                                              eagle_num_steps=cfg.eagle_num_steps or 6)
        return target, eagle, dflash, {"random_weights": cfg.preset, "toy_widths": cfg.toy_widths}, None
    paths = model_paths("WHIFLASH", cfg.model_name_or_path, cfg.draft_name_or_path, cfg.whiflash_eagle_draft,
                        Path(cfg.testbed) if cfg.testbed else None)
    if paths["target"] is None:
        raise ValueError("give --model-name-or-path, --testbed DIR, or --preset NAME (with --random-weights for "
                         "real shapes without a download)")
    session = Session.open(paths, cfg.device, cfg.dtype)
    target = session.target  # the engine options are set by run_profile
    eagle = dflash = None
    if paths["eagle3"]:
        opts = {"num_steps": cfg.eagle_num_steps} if cfg.eagle_num_steps else {}
        eagle = whiflash.load_drafter("eagle3", paths["eagle3"], target, **opts)
    if paths["dflash"]:
        dflash = whiflash.load_drafter("dflash", paths["dflash"], target)
    return target, eagle, dflash, paths, session


def _dev_prompt_ids(session: Session, testbed: Path, per_category: int) -> list[list[int]]:
    """Token ids of `per_category` testbed:dev prompts of every category (as datagen and the bench encode them);
    a category whose test split has no document outside the benchmark's pool (a toy testbed) takes
    testbed:heldout's prompts, with a warning."""
    from whiflash.testbed import CATEGORIES, held_out_prompts
    from whiflash.testbed.prompts import dev_prompts, heldout_split

    ids = []
    for cat in CATEGORIES:
        try:
            prompts = dev_prompts(testbed, cat, per_category)
        except ValueError as err:
            log.warning("--loop-prompts: %s; timing the loop on testbed:heldout's %s prompts instead", err, cat)
            prompts = held_out_prompts(testbed, cat, per_category, split=heldout_split(testbed, cat))
        ids += [session.encode([p.prompt]) for p in prompts]
    return ids


@owning_folders()  # the run folder's lock ends with the call
def run_profile(cfg: ProfileConfig, argv: list[str] | None = None) -> tuple[Path, LatencyProfile]:
    """Load the models of `cfg`, profile them and write `profile.json` in a new run folder (and `--output`)."""
    check_profile_config(cfg)
    cfg = resolve_engine(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    budgets = _ints(cfg.tree_budgets, "--tree-budgets")
    backlogs = _ints(cfg.backlogs, "--backlogs")
    check_folder(Path(cfg.out), None, "--out")  # where the results go is checked before minutes of profiling
    check_output_file(cfg.output)
    target, eagle, dflash, models, session = _load(cfg)
    if dflash is not None and not budgets:
        budgets = [dflash.block_size - 1]  # DDTree's default budget
    neural = None
    if cfg.whiflash_neural_router_path and not cfg.random_weights:
        neural = whiflash.load_router(cfg.whiflash_neural_router_path, hidden_size=target.config.hidden_size,
                                      device=target.device)
        models["neural_router"] = cfg.whiflash_neural_router_path
    target.set_engine(engine_options(str(target.device), bool(cfg.cuda_graphs), bool(cfg.compile_layers)))
    for d in (eagle, dflash):
        if d is not None:
            d.set_engine(target.engine)  # before the models' graph modes are read and restored
    graphs = target.engine.cuda_graphs
    loop_prompts = _dev_prompt_ids(session, Path(str(cfg.testbed)), cfg.loop_prompts) \
        if cfg.loop_prompts and session is not None else None
    prof = profile_models(target, eagle3=eagle, dflash=dflash, tree_budgets=budgets,
                          neural=neural, context=cfg.context, backlogs=backlogs, graphs=graphs,
                          repeats=cfg.repeats, loop_prompts=loop_prompts, loop_new_tokens=cfg.loop_new_tokens)
    prof.meta.update({"models": models, "preset": cfg.preset, "hardware": device_info(cfg.device)})
    label = cfg.preset or Path(str(models.get("target") or "models")).name
    run, _ = prepare_run_dir(cfg.out, cfg.name or f"profile-{label}", asdict(cfg), resume=False)
    write_manifest(run, command="profile", argv=list(argv if argv is not None else sys.argv), seed=0,
                   device=cfg.device, models=models, samples=[],
                   extra={"context": cfg.context,
                          "engine": describe(cfg.device, cfg.dtype, target.engine)})
    prof.write(run / "profile.json")
    if cfg.output:
        prof.write(cfg.output)
    log.info("profile written to %s%s", run / "profile.json", f" and {cfg.output}" if cfg.output else "")
    return run, prof
