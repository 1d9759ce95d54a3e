"""The flags of `whiflash-eval bench`, `calibrate` and `profile`, checked before anything is loaded or created.

Each value is range-checked under its own spelling (`--warmup-tokens: expected an integer >= 0, got -1`),
and a value given for a part of the run that no chosen method has is refused rather than ignored and
recorded (`--ddtree-tree-budget 9: no method of this run uses DDTree`). The library functions the flags
feed check again under their own names; these checks come first so that the message names the flag.
"""
from __future__ import annotations

import math

from whiflash.containment import plain_name
from whiflash.errors import UsageError
from whiflash.flags import check_choice, check_int, check_number
from whiflash.pairs import Pair

from .config import BenchConfig, ProfileConfig
from .methods import ORACLES, method_names

__all__ = ["DTYPES", "ROUTERS", "check_bench_config", "check_profile_config", "parse_thresholds", "tau_rule"]

DTYPES = ("float32", "bfloat16", "float16")
ROUTERS = ("entropy", "neural", "oracle", "utility-oracle")
"""`--whiflash-router` values."""


def _common(cfg: BenchConfig | ProfileConfig) -> None:
    check_choice(cfg.dtype, "--dtype", DTYPES)
    check_int(cfg.threads, "--threads", optional=True)
    check_int(cfg.eagle_num_steps, "--eagle-num-steps", optional=True)
    if cfg.name is not None:
        plain_name(cfg.name, "--name")


def check_bench_config(cfg: BenchConfig, *, methods: bool = True) -> None:
    """Refuse a flag of `cfg` out of range, or (with `methods`, for a bench run) one that applies to none of the
    run's methods (`--methods`, else `--speculative-algorithm`)."""
    _common(cfg)
    check_int(cfg.max_samples, "--max-samples", optional=True)
    check_int(cfg.max_new_tokens, "--max-new-tokens")
    check_int(cfg.max_prompt_tokens, "--max-prompt-tokens", optional=True)
    check_int(cfg.warmup_tokens, "--warmup-tokens", minimum=0)
    check_int(cfg.bootstrap, "--bootstrap")
    check_int(cfg.ddtree_tree_budget, "--ddtree-tree-budget", optional=True)
    check_int(cfg.whiflash_stick_tau, "--whiflash-stick-tau", optional=True)
    tau_rule(cfg)
    check_number(cfg.temperature, "--temperature", 0)
    check_number(cfg.whiflash_entropy_threshold, "--whiflash-entropy-threshold", 0,
                 what=" (nats: entropy is never negative, so a negative threshold never picks slot 0)")
    check_number(cfg.whiflash_neural_router_threshold, "--whiflash-neural-router-threshold", optional=True)
    check_number(cfg.strict_tolerance, "--strict-tolerance", 0)
    check_choice(cfg.whiflash_router, "--whiflash-router", ROUTERS)
    pair = Pair.parse(cfg.whiflash_drafters, what="--whiflash-drafters")
    if not methods:
        return
    names = method_names(cfg.speculative_algorithm, cfg.methods, cfg.whiflash_router)
    routed = [m for m in names if m.startswith("whiflash-") or m in ORACLES]
    shown = f"methods {', '.join(names)}; --whiflash-drafters {pair}"
    if cfg.ddtree_tree_budget is not None and "ddtree" not in names and not (routed and pair.uses_tree):
        raise UsageError(f"--ddtree-tree-budget {cfg.ddtree_tree_budget}: no method of this run uses DDTree "
                         f"({shown}); expected it only with the ddtree method or a pair with a DDTree slot")
    if cfg.eagle_num_steps is not None and "eagle3" not in names and not (routed and pair.needs_eagle3):
        raise UsageError(f"--eagle-num-steps {cfg.eagle_num_steps}: no method of this run uses EAGLE-3 ({shown}); "
                         "expected it only with the eagle3 method or a pair with an EAGLE-3 slot")
    if cfg.whiflash_tau_rule is not None and not any(m.startswith("whiflash-") for m in names):
        raise UsageError(f"--whiflash-tau-rule {cfg.whiflash_tau_rule}: only the routed methods (whiflash-entropy, "
                         f"whiflash-neural) follow it, and this run has {', '.join(names)}")
    if cfg.whiflash_latency_profile is not None and "utility-oracle" not in names:
        raise UsageError(f"--whiflash-latency-profile {cfg.whiflash_latency_profile}: only the utility-oracle "
                         f"method reads it, and this run has {', '.join(names)}")


def tau_rule(cfg: BenchConfig) -> tuple[int, int] | None:
    """`--whiflash-tau-rule` as (ENTER, LEAVE), or None; refused out of range or beside `--whiflash-stick-tau`."""
    from whiflash.decoding.routed import check_tau_rule

    try:
        rule = check_tau_rule(cfg.whiflash_tau_rule, "--whiflash-tau-rule")
    except ValueError as err:
        raise UsageError(str(err)) from None
    if rule is not None and cfg.whiflash_stick_tau is not None:
        raise UsageError("--whiflash-tau-rule and --whiflash-stick-tau both decide from earlier rounds' tau; "
                         "give one of them")
    return rule


def check_profile_config(cfg: ProfileConfig) -> None:
    """Refuse a flag of `whiflash-eval profile` out of range."""
    _common(cfg)
    check_int(cfg.context, "--context")
    check_int(cfg.repeats, "--repeats")
    check_int(cfg.loop_prompts, "--loop-prompts", 0)
    if cfg.loop_new_tokens is not None:
        check_int(cfg.loop_new_tokens, "--loop-new-tokens", 2)
    if cfg.loop_prompts and not cfg.testbed:
        raise UsageError("--loop-prompts: the dev prompts come from a built testbed; give --testbed DIR (or "
                         "--loop-prompts 0 for the random prompt)")
    if cfg.loop_prompts and cfg.random_weights:
        raise UsageError("--loop-prompts: random weights accept nothing on real prompts; give --loop-prompts 0")


def parse_thresholds(text: str, flag: str = "--thresholds") -> list[float]:
    """The comma-separated threshold values of `calibrate --thresholds`, each a number; `inf` and `-inf` pin a
    slot (that drafter alone, no routing decision: `whiflash.calibration.pinned_slot`)."""
    values = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise UsageError(f"{flag} {text!r}: {part!r} is not a number; expected comma-separated "
                             "thresholds, e.g. 0.1,0.2,0.4 (inf / -inf: one drafter alone)")
        values.append(value)
    if not values:
        raise UsageError(f"{flag} {text!r}: expected at least one threshold value")
    return values
