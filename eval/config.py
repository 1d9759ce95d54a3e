"""The configurations of `whiflash-eval bench` (and calibrate) and `whiflash-eval profile`: one field per flag.

Field names are the flags with dashes turned into underscores (`--speculative-algorithm` ->
`speculative_algorithm`); each field's `help` metadata is the flag's help text.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["BACKLOGS", "BenchConfig", "ProfileConfig", "SweepConfig", "flag"]

BACKLOGS = (1, 4, 16, 64, 256)
"""Default catch-up backlog lengths of `whiflash-eval profile`."""


def _h(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class BenchConfig:
    """Flags of `whiflash-eval bench`."""

    preset: str | None = _h(None, "A checkpoints/registry.json preset (e.g. qwen3-8b): target, drafter and router "
                            "ids and example thresholds as defaults; explicit flags override them.")
    speculative_algorithm: str = _h("WHIFLASH", "AR, EAGLE3, DFLASH, DDTREE or WHIFLASH: the method run against the "
                                    "AR baseline (ignored when --methods is given).")
    model_name_or_path: str | None = _h(None, "Target model: Hub repo id or local folder (default: <testbed>/target).")
    draft_name_or_path: str | None = _h(None, "The EAGLE-3 draft under --speculative-algorithm EAGLE3, the DFlash draft "
                                        "otherwise (DDTree reuses it). Default: <testbed>/eagle3 or <testbed>/dflash.")
    whiflash_eagle_draft: str | None = _h(None, "EAGLE-3 draft for WhiFlash pairs with e3 and for the eagle3 method "
                                          "(default: <testbed>/eagle3).")
    whiflash_drafters: str = _h("df-e3", "Drafter pair of the routed methods: df-e3, ddt-e3 or df-ddt (slot 0 first).")
    ddtree_tree_budget: int | None = _h(None, "DDTree tree nodes (default: the DFlash block size - 1).")
    tree_budget: str | None = _h(None, "Comma-separated DDTree budgets, e.g. 16,32,64: standalone DDTree runs at "
                                 "every budget in this one run (methods ddtree-b16, ...; added when --methods lacks "
                                 "DDTree), and tables report the best budget per category and dataset, as "
                                 "upstream's. Routed pairs keep --ddtree-tree-budget.")
    block_size: int | None = _h(None, "DFlash/DDTree block size: tokens per draft block, the pending one included "
                                "(default: the draft's config).")
    whiflash_router: str = _h("entropy", "Routing policy of WHIFLASH: entropy, neural, or for analysis oracle "
                              "(the larger tau each round) or utility-oracle (the larger tau / round time, "
                              "needs --whiflash-latency-profile).")
    whiflash_latency_profile: str | None = _h(None, "Latency profile JSON from `whiflash-eval profile`: each slot's "
                                              "round time for the utility-oracle method.")
    whiflash_neural_router_path: str | None = _h(None, "Neural router: Hub repo id, local folder or .safetensors file.")
    whiflash_neural_router_threshold: float | None = _h(None, "Neural threshold: slot 0 when predicted gain > it "
                                                        "(default: the router's own).")
    whiflash_entropy_threshold: float = _h(0.2, "Entropy threshold in nats: slot 0 (parallel drafter) below it.")
    whiflash_no_lazy_catchup: bool = _h(False, "Update the inactive drafter every round instead of lazily on a switch.")
    whiflash_stick_tau: int | None = _h(None, "Keep slot 0 without asking the router while it runs well: after two "
                                        "slot-0 rounds the earlier of which accepted at least this many tokens "
                                        "(routing costs a few percent of a round on small targets). Default: ask "
                                        "every round.")
    whiflash_tau_rule: str | None = _h(None, "ENTER,LEAVE: the router picks the first round's slot, the round before "
                                       "every later one: slot 0 after a slot-1 round that accepted >= ENTER tokens "
                                       "(bonus included), slot 1 after a slot-0 round of <= LEAVE, else the same slot "
                                       "(a run of accepted tokens tends to go on). Default: the router every round.")
    whiflash_thresholds: str | None = _h(None, "thresholds.json from `whiflash-eval calibrate`, comma-separated, one "
                                         "per routed method: per-category thresholds of the method each was "
                                         "calibrated for (overrides the flag values).")
    whiflash_time_catchup: bool = _h(False, "Synchronise around catch-up prefills to report their share of decode time "
                                     "(adds host synchronisations, so leave it off for speed figures).")
    eagle_num_steps: int | None = _h(None, "EAGLE-3 chain length (default: the drafter's).")
    dataset: str = _h("testbed:test", "Comma-separated sources: testbed:SPLIT, a .jsonl file (optionally FILE@CATEGORY) "
                      "or an upstream benchmark name (gsm8k, math500, aime24, aime25, alpaca, mt-bench, humaneval, "
                      "mbpp, lbpp, livecodebench, swe-bench), with upstream's prompts.")
    max_samples: int | None = _h(None, "Samples per --dataset source, chosen as upstream does: "
                                 "dataset.shuffle(seed=--seed).select(range(N)), all rows in order when it has at most "
                                 "N; a testbed split keeps N in equal shares per category. All when unset (testbed: "
                                 "32 per category).")
    max_new_tokens: int = _h(2048, "Tokens generated per sample and turn.")
    max_prompt_tokens: int | None = _h(None, "Cut prompts to their last this-many tokens.")
    temperature: float = _h(0.0, "Sampling temperature (0: greedy; the lossless check needs greedy).")
    enable_thinking: bool = _h(False, "Render chat templates with thinking on (off by default).")
    methods: str | None = _h(None, "Methods side by side, comma-separated: ar, eagle3, dflash, ddtree, "
                             "whiflash-entropy, whiflash-neural, oracle, utility-oracle (AR is always added); "
                             "ddtree-bN is DDTree at budget N, whiflash-entropy@T and whiflash-neural@T a router at "
                             "threshold T.")
    testbed: str | None = _h(None, "A built testbed folder: default target/eagle3/dflash paths and testbed:SPLIT prompts.")
    device: str | None = _h(None, "Torch device (default: cuda when available, else cpu).")
    dtype: str | None = _h(None, "Model dtype: float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 "
                           "elsewhere).")
    threads: int | None = _h(None, "torch intra-op CPU threads (default: torch's choice; 1 is fastest for tiny "
                             "models on a busy machine).")
    cuda_graphs: bool | None = _h(None, "Replay CUDA graphs for the fixed-shape passes (default: on with CUDA; "
                                  "--no-cuda-graphs for the eager path).")
    compile_layers: bool | None = _h(None, "With CUDA graphs: torch.compile the decoder layers' stages and drafter "
                                     "passes inside the graphs (fused norms, rotations and residuals; compiled once "
                                     "per pass width, a few seconds each). Default: on with CUDA graphs where "
                                     "torch.compile runs (Triton installed); --no-compile-layers to turn it off.")
    flash_attn: bool = _h(False, "Accepted for upstream commands (upstream: the target attends with FlashAttention-2 "
                          "and DDTree is skipped). Changes nothing here: this engine attends through its own "
                          "decode-attention kernel on CUDA and PyTorch SDPA elsewhere, DDTree included; recorded "
                          "in the manifest.")
    warmup_tokens: int = _h(32, "New tokens of each method's untimed warm-up decode.")
    bootstrap: int = _h(1000, "Bootstrap resamples for the speedup interval.")
    out: str = _h("runs/eval", "Parent folder of the run folder <timestamp>_<name>.")
    save_path: str | None = _h(None, "Also write the run's data here when it ends: results, every sample's row and "
                               "the flags, as JSON (whatever the suffix, e.g. upstream's .pt names: this toolkit "
                               "writes no pickles).")
    name: str | None = _h(None, "Run name (default: algorithm or methods, and dataset).")
    seed: int = _h(0, "Seed of the sample selection (0: upstream's), the bootstrap and sampling.")
    strict: bool = _h(False, "Exit non-zero when an output differs from AR with a float32 margin above "
                      "--strict-tolerance (or an unknown margin).")
    strict_tolerance: float = _h(0.05, "Top-2 float32 logit margin up to which a mismatch counts as a numerical tie.")
    no_plots: bool = _h(False, "Skip the plots.")
    allow_mixed_devices: bool = _h(False, "Under torchrun, run although the ranks' GPUs are different models (each "
                                   "speedup stays paired on one GPU, but pooled tokens/s then mix machines).")

    def run_name(self) -> str:
        if self.name:
            return self.name
        what = self.methods.replace(",", "+") if self.methods else self.speculative_algorithm.lower()
        parts = []
        for src in self.dataset.split(","):
            src = src.strip().split("@")[0]
            parts.append(src.replace(":", "-") if src.startswith("testbed:") else Path(src).stem or src)
        return f"{what}_{'+'.join(parts)}"[:80].replace(" ", "").replace("/", "_")


@dataclass
class ProfileConfig:
    """Flags of `whiflash-eval profile` (names as in `bench`: dashes for underscores)."""

    preset: str | None = _h(None, "A checkpoints/registry.json preset: its Hub ids as model defaults, or with "
                            "--random-weights its real shapes (checkpoints/<preset>/*/config.json).")
    random_weights: bool = _h(False, "Build the preset's target and drafters at real shapes with random weights "
                              "(no download); model paths are then not used.")
    toy_widths: bool = _h(False, "With --random-weights: shrink every width, keep layer counts and taps (a CPU "
                          "check of the code path; its timings mean nothing).")
    model_name_or_path: str | None = _h(None, "Target: Hub id or folder (default: <testbed>/target).")
    draft_name_or_path: str | None = _h(None, "The DFlash draft (default: <testbed>/dflash); DDTree reuses it.")
    whiflash_eagle_draft: str | None = _h(None, "The EAGLE-3 draft (default: <testbed>/eagle3).")
    whiflash_neural_router_path: str | None = _h(None, "Neural router to time (default, and always with "
                                                 "--random-weights: a random router of the target's width, same "
                                                 "cost).")
    testbed: str | None = _h(None, "A built testbed folder: default target and drafter paths.")
    eagle_num_steps: int | None = _h(None, "EAGLE-3 chain length (default: the drafter's; 6 with --random-weights).")
    tree_budgets: str | None = _h(None, "Comma-separated DDTree budgets to profile (default: the DFlash block - 1).")
    context: int = _h(1024, "Committed context length of every measurement.")
    loop_prompts: int = _h(0, "With --testbed: time the loop's rounds on real decodes of this many dev prompts a "
                           "category (testbed:dev, the test split's documents outside the benchmark's pool; "
                           "--loop-new-tokens each, prompts cut to --context) instead of after a random "
                           "prompt of --context tokens, where every round commits about one token: a round's cost at "
                           "the acceptance and contexts a bench sees (0: the random prompt).")
    loop_new_tokens: int | None = _h(None, "New tokens of each timed loop decode (default: 128 with --loop-prompts, "
                                     "long enough for a drafter's acceptance to settle past the prompt's end; 48 "
                                     "after the random prompt).")
    backlogs: str = _h(",".join(map(str, BACKLOGS)), "Comma-separated catch-up backlog lengths.")
    repeats: int = _h(20, "Timed calls per component (median; on CUDA 3 batches of this many).")
    device: str | None = _h(None, "Torch device (default: cuda when available, else cpu).")
    dtype: str | None = _h(None, "Model dtype (default: bfloat16 on CUDA, float32 elsewhere).")
    cuda_graphs: bool | None = _h(None, "Replay CUDA graphs for the fixed-shape passes (default: on with CUDA; "
                                  "--no-cuda-graphs profiles the eager path, what `bench --no-cuda-graphs` runs).")
    compile_layers: bool | None = _h(None, "torch.compile the decoder layers' stages inside the graphs (default: as "
                                     "`bench`, on with CUDA graphs where torch.compile runs; --no-compile-layers).")
    threads: int | None = _h(None, "torch intra-op CPU threads.")
    out: str = _h("runs/eval", "Parent folder of the run folder <timestamp>_<name>.")
    name: str | None = _h(None, "Run name (default: profile-<preset or target folder>).")
    output: str | None = _h(None, "Also write the profile JSON here (e.g. for --whiflash-latency-profile).")


@dataclass
class SweepConfig(BenchConfig):
    """Flags of `whiflash-eval sweep`: every bench flag, plus the threshold lists swept in the same run."""

    entropy_thresholds: str | None = _h(None, "Comma-separated entropy thresholds: whiflash-entropy runs at each "
                                        "(methods whiflash-entropy@T; added when --methods lacks it).")
    neural_thresholds: str | None = _h(None, "Comma-separated neural-router thresholds: whiflash-neural runs at "
                                       "each (methods whiflash-neural@T; needs --whiflash-neural-router-path).")


def flag(name: str) -> str:
    """The CLI spelling of a config field."""
    return "--" + name.replace("_", "-")


def config_fields() -> list[Any]:
    return list(fields(BenchConfig))
