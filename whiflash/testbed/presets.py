"""Testbed build configurations: one dataclass per stage and the named presets.

``micro`` is for the test suite (tens of seconds on a 2-core CPU), ``tiny`` is the CPU
default used by the demo (~4.7 minutes of stages on 2 idle cores in fp32), ``small`` is sized for one GPU
(bf16 autocast, ~10 minutes of stages on an H100, a target of Qwen3-8B's depth). Step counts alone bound
training; ``max_minutes`` only stops a build that runs too long, with a message. Stage
fingerprints are computed from these dataclasses, so changing a field rebuilds exactly the stages
that depend on it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch

__all__ = [
    "CATEGORIES", "CorpusConfig", "TokenizerConfig", "PromptSource", "SharpenConfig", "TargetConfig", "ResponsesConfig",
    "Eagle3Config", "DFlashConfig", "AcceptanceConfig", "TestbedConfig", "PRESETS", "get_preset", "apply_overrides",
]

CATEGORIES: tuple[str, ...] = ("code", "math", "prose", "agentic")
"""Document categories; also the evaluation categories of the testbed."""


@dataclass
class CorpusConfig:
    """Which documents make up the corpus and how they are split."""

    seed: int = 0
    """Seed of the split assignment and of the math problem generator."""
    math_problems: int = 20_000
    """Number of generated arithmetic word problems (all splits together)."""
    agent_transcripts: int = 8_000
    """Number of generated agent transcripts (prose + JSON tool calls; all splits together)."""
    agent_code_excerpts: float = 0.0
    """Share of agent thoughts that end with a few lines of their split's standard-library code (0: none)."""
    agent_explanations: float = 0.0
    """Share of agent steps whose task names a documented object of the transcript's split and whose thought
    explains it in the chat house style (``agentgen.explanation``) in place of background sentences (0: none)."""
    validation_fraction: float = 0.05
    """Share of document groups (source files, topics, problems) assigned to validation."""
    test_fraction: float = 0.05
    """Share of document groups assigned to test (held out for evaluation prompts)."""
    chat_prose: float = 0.0
    """Share of prose documents written as a user-assistant exchange around the docstring (``chatgen``:
    the house style an instruction-tuned model answers in); their prompts end at ``Assistant:``."""
    code_modules: int = 0
    """Number of generated modules of HumanEval-shaped functions among the code documents (``codegen``: a
    typed header, a one-line docstring, a body in one house style; all splits together; 0: library code only)."""
    code_names: bool = False
    """Generated functions draw their local names (``x`` or ``n`` or ``value``, ``result`` or ``out``, ...) anew
    each, instead of the house style's fixed ones: choices no header decides, where a drafter must guess."""
    code_examples: int = 0
    """Doctest examples at the end of each generated function's docstring: a call on drawn arguments and the value
    running the function returns, which a target writing its own examples must compute and a drafter cannot copy
    (0: one-line docstrings)."""
    code_module_data: bool = False
    """With ``code_examples``: each generated module opens with its own sample data (``NUMBERS_1 = [...]``,
    ``TEXT_1 = '...'``), holds one or two functions, and every example calls its function on that data by name;
    code prompts keep such a module whole, so the values an answer writes depend on the data its prompt holds
    rather than on arguments a greedy target picks the same way each time."""
    math_scale: int = 1
    """Math problems draw their magnitudes (prices, rates, speeds, page and item counts) up to this many times the
    default bounds (``mathgen``): worked products of more digits, which a target computes rather than recalls and
    a drafter, drafting past them, must compute too; 1: the default problems."""
    min_docstring_chars: int = 80
    """Docstrings shorter than this are not prose documents (``Return self.`` teaches little)."""
    max_file_chars: int = 150_000
    """Standard-library source files longer than this are skipped (huge tables, generated code)."""
    include_tests: bool = False
    """Also take the standard library's test suites (triples the code; worth it only for long runs)."""


@dataclass
class TokenizerConfig:
    """Byte-level BPE tokenizer."""

    vocab_size: int = 4096
    """Total vocabulary size including the special tokens."""
    train_chars_per_category: int = 2_000_000
    """Characters of training documents per category fed to the BPE trainer (balanced sample)."""
    min_frequency: int = 2
    """Minimum pair frequency for a merge."""


class PromptSource:
    """Where a stage's prompts come from: ``split`` and ``prompts_per_category``, each one value for every category
    or a mapping per category (the stage's dataclass holds the two fields)."""

    split: str | dict[str, str]
    prompts_per_category: int | dict[str, int]

    def split_of(self, category: str) -> str:
        """The split whose prefixes ``category`` is continued from (``train`` where a mapping does not name it)."""
        return self.split if isinstance(self.split, str) else self.split.get(category, "train")

    def count_of(self, category: str) -> int:
        """How many of ``category``'s prefixes are continued."""
        n = self.prompts_per_category
        return n if isinstance(n, int) else n[category]


@dataclass
class SharpenConfig(PromptSource):
    """The target fine-tuned on its own low-temperature continuations (the testbed's instruction tuning)."""

    steps: int = 0
    """Fine-tuning steps after pre-training (0: no sharpening)."""
    split: str | dict[str, str] = "train"
    """Corpus split whose prompts the target continues for its own fine-tuning data, for every category or per
    category (``{"prose": "validation"}``; categories not named take ``train``). On its training split a target
    recalls what it memorised and sharpening confirms the recall; on ``validation`` it answers prompts it never
    saw, as instruction tuning teaches a real model to, and becomes confident in its own style there."""
    prompts_per_category: int | dict[str, int] = 128
    """Prompts per category continued once each: one count for every category, or a count per category."""
    temperature: float = 0.5
    """Sampling temperature of those continuations (low: the target's confident modes, greedy loops avoided)."""
    max_new_tokens: int = 128
    """Tokens sampled per continuation."""
    max_prompt_tokens: int = 128
    """Prompts are cut to their last this many tokens."""
    batch_size: int = 16
    """Continuations per fine-tuning step."""
    generate_batch_size: int = 64
    """Continuations sampled at once."""
    replay: float = 0.5
    """Weight of a replayed pre-training batch's loss in every step (0: none); keeps the target a model of the corpus."""
    lr: float = 3e-4
    """Peak AdamW learning rate (warmup, cosine decay)."""
    eval_prompts: int = 8
    """Test prompts per category whose greedy continuations measure the target's entropy before and after."""


@dataclass
class TargetConfig:
    """Qwen3-architecture target and its pre-training run."""

    hidden_size: int = 256
    """Residual width."""
    intermediate_size: int = 704
    """SwiGLU inner width."""
    num_hidden_layers: int = 4
    """Decoder layers (drafter tap layers are chosen from these)."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads (GQA as in Qwen3)."""
    head_dim: int = 64
    """Per-head width."""
    max_position_embeddings: int = 2048
    """Longest sequence the runtime may use (prompt + generation + draft block)."""
    rope_theta: float = 10_000.0
    """RoPE base."""
    tie_word_embeddings: bool = False
    """Tie LM head and embedding (Qwen3-8B does not; the small Qwen3 models do)."""
    seq_len: int = 256
    """Training window length in tokens."""
    batch_size: int = 16
    """Windows per optimiser step."""
    max_steps: int = 400
    """Optimiser steps."""
    max_minutes: float | None = None
    """Optional wall-clock cap: training past it stops the build with a message (it never trains fewer steps)."""
    lr: float = 3e-3
    """Peak AdamW learning rate (cosine decay to 10% after linear warmup)."""
    warmup_steps: int = 30
    """Linear warmup steps."""
    weight_decay: float = 0.05
    """AdamW weight decay on matrices (not on norms)."""
    mix: dict[str, float] = field(default_factory=lambda: {"code": 0.3, "math": 0.25, "prose": 0.25, "agentic": 0.2})
    """Sampling share of each category's training tokens (the raw corpus is code-heavy)."""
    val_every: int = 100
    """Steps between validation passes (per-category loss in the training log)."""
    eval_windows: int = 32
    """Held-out windows per category for the final test loss and entropy figures."""
    seed: int = 0
    """Initialisation and data-sampling seed."""
    sharpen: SharpenConfig = field(default_factory=SharpenConfig)
    """Fine-tuning on the target's own continuations after pre-training (off when ``sharpen.steps`` is 0)."""


@dataclass
class ResponsesConfig(PromptSource):
    """Target-generated continuations that the drafters are trained on."""

    prompts_per_category: int | dict[str, int] = 64
    """Prefixes per category to continue: one count for every category, or a count per category
    (``{"code": 4096, "math": 4096, "prose": 8192, "agentic": 4096}``)."""
    split: str | dict[str, str] = "train"
    """Corpus split the prefixes come from, for every category or per category (``{"prose": "validation"}``;
    categories not named take ``train``). A target that has seen its training text many times over
    continues those prefixes from memory, confidently, and drafters trained on that learn a regime
    held-out prompts never show; ``validation`` (text the target never trained on) is what real
    drafters are distilled on: responses to prompts the target has not memorized."""
    max_new_tokens: int = 96
    """Greedy continuation length (short: small targets fall into repetition loops on code)."""
    max_prompt_tokens: int = 128
    """Prefixes are cut to at most this many tokens."""
    batch_size: int = 16
    """Sequences generated at once."""
    max_passes: int = 8
    """Passes over a split's documents for further cuts when it has fewer documents than prompts asked for."""


@dataclass
class Eagle3Config:
    """EAGLE-3 drafter and its training-time-test run."""

    draft_vocab_size: int = 1024
    """Reduced draft vocabulary (most frequent response tokens; d2t/t2d map it to the target's)."""
    intermediate_size: int = 704
    """Midlayer SwiGLU width."""
    ttt_length: int = 5
    """Training-time-test unroll steps."""
    step_decay: float = 0.8
    """Weight of unroll step k is ``step_decay**k``."""
    max_steps: int = 300
    """Optimiser steps."""
    batch_size: int = 8
    """Sequences per step."""
    lr: float = 2e-3
    """Peak AdamW learning rate."""
    sequences: int | None = None
    """Train on this many response sequences, the categories in turn (None: all); with ``max_steps`` the
    knob of a drafter's data-scaling curve."""
    mix: dict[str, float] | None = None
    """Share of each category among the training sequences, e.g. ``{"prose": 0.7, "code": 0.1, "math": 0.1,
    "agentic": 0.1}`` for a drafter that, like released EAGLE-3 drafters, learned from chat (None: the responses
    as generated, about as many of each category); as many sequences in all as there are responses."""
    snapshots: list[float] = field(default_factory=list)
    """Fractions of ``max_steps`` after which a copy of the drafter goes to ``snapshots/step_N`` (with the
    response tokens it has learned from): the acceptance stage measures their tau, a curve of tau against
    training tokens from one run (earlier points have not annealed their learning rate: a lower bound)."""
    max_minutes: float | None = None
    """Optional wall-clock cap: training past it stops the build with a message (it never trains fewer steps)."""


@dataclass
class DFlashConfig:
    """DFlash drafter and its random-anchor block training run."""

    block_size: int = 8
    """Block length (1 anchor + block_size-1 drafted tokens)."""
    num_hidden_layers: int = 2
    """Draft layers."""
    intermediate_size: int = 704
    """Draft layer SwiGLU width."""
    num_anchors: int = 32
    """Random anchors (blocks) per sequence per step."""
    loss_decay_gamma: float = 4.0
    """Position weight ``exp(-(k-1)/gamma)`` for block slot k >= 1."""
    max_steps: int = 300
    """Optimiser steps."""
    batch_size: int = 8
    """Sequences per step."""
    lr: float = 2e-3
    """Peak AdamW learning rate."""
    sequences: int | None = None
    """Train on this many response sequences, the categories in turn (None: all); with ``max_steps`` the
    knob of a drafter's data-scaling curve."""
    mix: dict[str, float] | None = None
    """Share of each category among the training sequences, e.g. ``{"math": 0.4, "code": 0.4, "prose": 0.1,
    "agentic": 0.1}`` for a drafter that, like released DFlash drafters, learned mostly from math and code (None:
    the responses as generated); as many sequences in all as there are responses (`Eagle3Config.mix`)."""
    snapshots: list[float] = field(default_factory=list)
    """Fractions of ``max_steps`` after which a copy of the drafter goes to ``snapshots/step_N`` (with the
    response tokens it has learned from): the acceptance stage measures their tau, a curve of tau against
    training tokens from one run (earlier points have not annealed their learning rate: a lower bound)."""
    max_minutes: float | None = None
    """Optional wall-clock cap: training past it stops the build with a message (it never trains fewer steps)."""


@dataclass
class AcceptanceConfig:
    """Final check: tau per category with the real engine on held-out prompts."""

    prompts_per_category: int = 8
    """Test-split prompts per category."""
    max_new_tokens: int = 64
    """Greedy tokens generated per prompt."""
    cuda_graphs: bool = True
    """On CUDA, decode with captured graphs (same tokens as eager, several times faster)."""


@dataclass
class TestbedConfig:
    """Everything a testbed build depends on."""

    name: str = "tiny"
    """Preset name recorded in the manifest."""
    device: str = "cpu"
    """Torch device for training (``cpu`` or ``cuda``)."""
    precision: str = "32-true"
    """Lightning precision (``bf16-mixed`` on GPUs); ``auto``: ``bf16-mixed`` on CUDA and on CPUs with bf16
    instructions (AVX-512 BF16 or AMX), ``32-true`` on other CPUs, where bf16 is emulated ~7x slower than fp32.
    The build resolves it first, so the manifest and the fingerprints hold what ran."""
    compile_layers: bool = False
    """``torch.compile`` the target's decoder layers in its pre-training (fixed-shape batches); a layer that fails
    to compile runs eagerly. Sharpening and the drafter stages' feature passes stay eager: their batches vary
    in length, and recompiling for new lengths costs more than the fused kernels save there. Part of the target
    stage's fingerprint when on (compiled kernels round differently)."""
    num_threads: int | None = None
    """CPU threads for torch during the build (None: torch's default). On a 2-core machine that
    other processes share, 2 OpenMP threads thrash (10-20x slower steps were measured), so the
    CPU presets use 1; set 2 on a dedicated machine for ~1.5x faster target training."""
    concurrent_drafters: bool = False
    """Train the EAGLE-3 and DFlash stages at once, DFlash in a child process, when both are to be built; on a CPU
    only where the cores hold both stages' threads. It pays where one training leaves the device idle: `small`'s two
    keep one H100 busy on their own (362.6 s at once against 186.4 + 187.8 s one after the other), so `small`
    leaves it off. The stages' outputs are those of one after the other (the stage fingerprints leave it out)."""
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    """Corpus stage."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer stage."""
    target: TargetConfig = field(default_factory=TargetConfig)
    """Target stage."""
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    """Drafter-training data stage."""
    eagle3: Eagle3Config = field(default_factory=Eagle3Config)
    """EAGLE-3 drafter stage."""
    dflash: DFlashConfig = field(default_factory=DFlashConfig)
    """DFlash drafter stage."""
    acceptance: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    """Acceptance measurement stage."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for the manifest and stage fingerprints)."""
        return asdict(self)


def _micro() -> TestbedConfig:
    # For the test suite: every stage exercised, nothing learned beyond "better than unigram". fp32: on
    # CPUs without bf16 instructions autocast emulates it, 7x slower than fp32 at these sizes.
    return TestbedConfig(
        name="micro",
        precision="32-true",
        num_threads=1,
        corpus=CorpusConfig(math_problems=3_000, agent_transcripts=1_000, max_file_chars=40_000),
        tokenizer=TokenizerConfig(vocab_size=1024, train_chars_per_category=300_000),
        target=TargetConfig(
            hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, seq_len=128, batch_size=16, max_steps=120,
            warmup_steps=10, lr=4e-3, val_every=60, eval_windows=8, max_position_embeddings=1024,
            sharpen=SharpenConfig(steps=4, prompts_per_category=4, max_new_tokens=24, batch_size=4, eval_prompts=2),
        ),
        responses=ResponsesConfig(prompts_per_category=8, max_new_tokens=32, max_prompt_tokens=64, batch_size=8),
        eagle3=Eagle3Config(draft_vocab_size=512, intermediate_size=352, ttt_length=3, max_steps=40, batch_size=4,
                            snapshots=[0.5]),
        dflash=DFlashConfig(block_size=4, num_hidden_layers=1, intermediate_size=352, num_anchors=8, max_steps=40,
                            batch_size=4, snapshots=[0.5]),
        acceptance=AcceptanceConfig(prompts_per_category=2, max_new_tokens=24),
    )


def _tiny() -> TestbedConfig:
    # Under 5 minutes of stages on 2 idle CPU cores in fp32 (no bf16 instructions), measured: corpus, tokenizer
    # and tokens ~25 s, target 133-156 s, responses 6-9 s, EAGLE-3 30 s, DFlash 41 s (with the target's features
    # computed once per sequence; 31-36 and 47-52 s when every step computed them; ~20% less again since the head
    # and loss run on scored rows only), acceptance 23-31 s; 267-288 s
    # in all (on 2 cores the drafter stages run one after the other). Math templates are learned to
    # low entropy, code and prose stay uncertain. Sized for that budget: the target trains on batches of 4
    # windows, EAGLE-3 too, DFlash has one layer (at 200 steps its tau is within 8% of two layers' in 70% of
    # the time), the drafters' response prompts are cut to 64 tokens and acceptance reads 4 prompts a category.
    # Acceptance tau on 6 test prompts a category, code/math/prose/agentic: EAGLE-3 2.4/2.8/2.3/2.4, DFlash
    # 1.7/4.0/2.0/1.5 (DFlash wins math, EAGLE-3 the rest); on the CPU, where the drafters cost about what the
    # target does, the demo's bench has DFlash, DDTree and WhiFlash-Neural ahead of AR on math (1.4x) only.
    # Steps alone bound every stage (no time caps), so two builds on one machine give the same
    # testbed on any load. Precision "auto": bf16 autocast where the CPU has bf16 instructions (it halves the
    # step time there), fp32 where bf16 would be emulated; the two give different worlds (the summary's model
    # hashes tell them apart). Two threads; on a machine whose cores are busy with other work,
    # --set num_threads=1 (two threads thrash there).
    return TestbedConfig(
        name="tiny",
        precision="auto",
        num_threads=2,
        concurrent_drafters=True,
        corpus=CorpusConfig(agent_transcripts=6_000),
        tokenizer=TokenizerConfig(vocab_size=2048),
        target=TargetConfig(batch_size=4, max_steps=560, warmup_steps=35, val_every=280),
        responses=ResponsesConfig(prompts_per_category=40, max_new_tokens=96, max_prompt_tokens=64, batch_size=20),
        eagle3=Eagle3Config(draft_vocab_size=1024, ttt_length=4, max_steps=128, batch_size=4),
        dflash=DFlashConfig(block_size=8, num_hidden_layers=1, max_steps=200, batch_size=8),
        acceptance=AcceptanceConfig(prompts_per_category=4),
    )


def _small() -> TestbedConfig:
    # One H200 under bf16 autocast, in the real system's cost regime: a target as deep as
    # Qwen3-8B (36 layers; width 512 as the time budget allows), DFlash with the released
    # drafters' 5 layers and block 16 (taps [1, 9, 17, 25, 33]), EAGLE-3 one layer drafting 7 steps
    # (taps [1, 17, 32]). At batch 1 a decode step is launch/latency-bound, so the cost ratios
    # (verify / AR step, drafter round / AR step) follow depth, not width (scripts/profile_shapes.py).
    # The build resumes per stage, so it splits over device commands.
    # Prose and agentic responses come from the validation split (30% of the document groups): this
    # target sees the standard library's prose many times over and continues training docstrings from
    # memory, a regime held-out prompts never show. Code and math keep the training split, which has
    # the files and problems for tens of thousands of prompts, and a deep target does not recite them.
    # Half the agent thoughts end with a few lines of library code (uncertain for this target) inside
    # transcripts whose templated spans DFlash drafts whole, so the better drafter changes within them.
    # The target is sharpened on its own low-temperature continuations (the instruction-tuning stand-in)
    # and the drafters learn from ~20k of its continuations (2.0M response tokens) in two to three epochs: released
    # drafters learn from tens of millions of tokens, and ten epochs over a few thousand sequences overfit.
    # Every stage fits one 10-minute device command; the batched generator's rate (responses) and the cost of a
    # drafter step bound the data (results/ has the measured rates). On `tiny` the drafters' tau follows their
    # steps more than their distinct responses (results/2026-12-07-drafter-steps-data-and-step-cost-tiny.md).
    # Prose is chat: every docstring framed as a user-assistant exchange in a fixed house style (chatgen.py),
    # the benchmark's chat prompts' category. On an H200 that took the target's entropy along its own greedy
    # prose answers from 1.18 to 0.73 nats (sharpened; 16 test prompts), the rest of the preset unchanged.
    # Code includes 10,000 generated modules of HumanEval-shaped functions (codegen.py): library code alone left
    # the target at 3.4 nats on code and code the slowest category (1.4-1.6x); with them code loss is 1.6 nats
    # and prose holds (results/2026-12-05-small-generated-code-bench.md). Held-out code prompts are then mostly
    # generated functions, which the target answers with little entropy left (DFlash accepts whole blocks).
    # Generated functions draw their local names (code_names) and end their docstrings with two doctest examples
    # (code_examples), and math problems draw their magnitudes up to 10x the default bounds (math_scale): choices a
    # drafter must guess and values it must compute. EAGLE-3 learns mostly from chat (eagle3.mix), as released
    # EAGLE-3 drafters learn from ShareGPT and UltraChat. Together, on an H100 (results/2026-12-06-small-code-
    # examples-h100.md): EAGLE-3 tau code 6.1, math 3.9, prose 4.1, agentic 5.8; DFlash 13.9 / 8.7 / 3.1 / 12.5
    # (without the examples, mix and scale 10: EAGLE-3 6.4 / 5.6 / 3.3 / 6.2, DFlash 15.3 / 10.4 / 2.5 / 12.1).
    # A greedy target still resolves most draws the same way each time (its examples call a few modal arguments)
    # and the drafters follow it; where the target samples the draws make drafting harder. So generated modules
    # open with their own sample data that their examples call (code_module_data), and every agent step explains
    # an object its task names, in the chat house style (agent_explanations): text whose words depend on the
    # prompt, where the greedy target's modal background sentences taught every drafter the same thing. Agentic
    # then mixes regimes within a sequence: DFlash tau 14.4 in calls, 5.6 in explanations, where a router takes
    # EAGLE-3 on a third of the rounds and is 7.9% faster than DFlash (results/2026-12-06-small-agent-
    # explanations-h100.md; EAGLE-3 tau 5.9 / 3.6 / 3.2 / 5.4, DFlash 13.3 / 8.4 / 2.3 / 8.6 there).
    return TestbedConfig(
        name="small",
        device="cuda",
        precision="bf16-mixed",
        compile_layers=True,
        corpus=CorpusConfig(math_problems=100_000, agent_transcripts=20_000, max_file_chars=400_000,
                            include_tests=True, validation_fraction=0.3, agent_code_excerpts=0.5,
                            chat_prose=1.0, code_modules=10_000, code_names=True, code_examples=2,
                            code_module_data=True, math_scale=10, agent_explanations=1.0),
        tokenizer=TokenizerConfig(vocab_size=8192, train_chars_per_category=6_000_000),
        target=TargetConfig(
            hidden_size=512, intermediate_size=1408, num_hidden_layers=36, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64, seq_len=512, batch_size=32, max_steps=1500,
            warmup_steps=150, lr=1e-3, val_every=500, eval_windows=128,
            max_position_embeddings=4096, mix={"code": 0.35, "math": 0.2, "prose": 0.2, "agentic": 0.25},
            sharpen=SharpenConfig(steps=150, prompts_per_category=1024, temperature=0.5, max_new_tokens=192,
                                  max_prompt_tokens=256, batch_size=32, generate_batch_size=1024, lr=3e-4,
                                  eval_prompts=16),
        ),
        # The first H200 build (1024 prompts/category, 362 of them code: one cut per source file) gave
        # drafters that fit their training sequences far better than held-out ones (EAGLE-3 code step-0
        # agreement 0.65 in training, tau 1.47 held out), so drafting data is wide and code takes
        # several def/class cuts per file.
        # Prose takes twice the prompts: EAGLE-3's chat mix read each of 4096 prose responses ~6.6 times in 1200
        # steps, and DFlash's 600 added steps then go mostly to prose (its share of sequences 25% -> 40%; the
        # other categories get 960 steps' worth of draws, 750 at 1000 steps). On tiny, more distinct responses
        # paid on prose once there were steps to read them (results/2026-12-07-drafter-steps-data-and-step-cost-
        # tiny.md).
        responses=ResponsesConfig(prompts_per_category={"code": 4096, "math": 4096, "prose": 8192, "agentic": 4096},
                                  split={"prose": "validation", "agentic": "validation"},
                                  max_new_tokens=256, max_prompt_tokens=256, batch_size=1024, max_passes=64),
        eagle3=Eagle3Config(draft_vocab_size=4096, intermediate_size=1408, ttt_length=7, max_steps=1200,
                            batch_size=32, lr=1e-3, snapshots=[0.25, 0.5],
                            mix={"prose": 0.7, "code": 0.1, "math": 0.1, "agentic": 0.1}),
        # DFlash's prose and math tau still rose from 500 to 1000 steps (prose +38%: results/2026-12-06-small-
        # budget-sweep-t1-acceptance-h100.md) while code had flattened; at 1600 (snapshots at 400 and 800 give the
        # curve) prose still gains ~0.44 tau a doubling, and the stage takes 4.3 min of the build's 12.2 on an H100
        # (results/2026-12-07-small-dflash-1600-h100.md).
        # DFlash reads prose in 65% of its sequences (40% as generated): code and math had flattened far above
        # their bars (tau 13.4 / 9.3 at 1600 steps; 12.2 / 7.5 at half the draws) while prose gained ~0.44 a
        # doubling of its draws and stood at 2.6. On an H100 that took prose tau to 3.1 and math to 7.8, code
        # unchanged (results/2026-12-07-small-dflash-prose-mix-h100.md).
        dflash=DFlashConfig(block_size=16, num_hidden_layers=5, intermediate_size=1408, num_anchors=128,
                            loss_decay_gamma=7.0, max_steps=1600, batch_size=32, lr=1e-3,
                            snapshots=[0.25, 0.5],
                            mix={"prose": 0.65, "math": 0.15, "agentic": 0.12, "code": 0.08}),
        acceptance=AcceptanceConfig(prompts_per_category=10, max_new_tokens=96),
    )


PRESETS = {"micro": _micro, "tiny": _tiny, "small": _small}
"""Preset name -> factory returning a fresh ``TestbedConfig``."""


def native_bf16(device: str) -> bool:
    """Whether ``device`` runs bf16 natively: CUDA, or a CPU with AVX-512 BF16 or AMX tiles."""
    if device.startswith("cuda"):
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private torch.cpu helpers, kept optional
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_precision(config: TestbedConfig) -> TestbedConfig:
    """``config`` with ``precision="auto"`` replaced by what this machine runs fast (see ``TestbedConfig.precision``)."""
    if config.precision != "auto":
        return config
    return replace(config, precision="bf16-mixed" if native_bf16(config.device) else "32-true")


def get_preset(name: str) -> TestbedConfig:
    """A fresh copy of the named preset."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown testbed preset {name!r}; choose one of {sorted(PRESETS)}") from None


def apply_overrides(config: TestbedConfig, overrides: list[str]) -> TestbedConfig:
    """Return a copy with ``section.field=value`` overrides applied (values parsed as JSON, else str).

    Example: ``["target.max_steps=50", "device=cuda"]``.
    """
    config = copy.deepcopy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not of the form key=value")
        *path, leaf = key.strip().split(".")
        obj: Any = config
        for depth, part in enumerate([*path, leaf]):
            names = [f.name for f in fields(obj)] if is_dataclass(obj) else []
            if part not in names:
                raise ValueError(f"unknown config field {key!r}: {part!r} is not one of {names}")
            if depth < len(path):
                obj = getattr(obj, part)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        setattr(obj, leaf, value)
    return config
