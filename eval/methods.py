"""Decoding methods built from the benchmark flags, all sharing one loaded target.

A method is a name (`ar`, `eagle3`, `dflash`, `ddtree`, `whiflash-entropy`, `whiflash-neural`,
`oracle`, `utility-oracle`; `ddtree-bN` for DDTree at tree budget N and `whiflash-entropy@T`,
`whiflash-neural@T` for a router at threshold T, `whiflash.eval.families`) and a drafter for
`whiflash.generate` (None for plain autoregressive decoding). Drafter checkpoints load once and are shared between methods; routed methods use the pair given by
`--whiflash-drafters`. The upstream `--speculative-algorithm` picks one method (plus the AR baseline);
`--methods` lists several to run side by side.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import whiflash
from whiflash import session
from whiflash.calibration import pinned_slot
from whiflash.pairs import Pair

from .families import budget_method, parse_method

log = logging.getLogger(__name__)

__all__ = ["ALGORITHMS", "METHODS", "Method", "MethodFactory", "check_method", "method_names", "model_paths"]

ALGORITHMS = ("AR", "EAGLE3", "DFLASH", "DDTREE", "WHIFLASH")
"""`--speculative-algorithm` values (upstream spelling)."""

METHODS = ("ar", "eagle3", "dflash", "ddtree", "whiflash-entropy", "whiflash-neural", "oracle", "utility-oracle")
"""`--methods` values; `whiflash` alone means the router chosen by `--whiflash-router`."""

LABELS = {"ar": "AR", "eagle3": "EAGLE-3", "dflash": "DFlash", "ddtree": "DDTree",
          "whiflash-entropy": "WhiFlash-Entropy", "whiflash-neural": "WhiFlash-Neural", "oracle": "Oracle",
          "utility-oracle": "Utility oracle"}
ORACLES = ("oracle", "utility-oracle")
"""Analysis methods: both slots draft every round (OracleDrafter), not a routing policy."""
ROUTED = ("whiflash-entropy", "whiflash-neural")
"""Routing policies, the methods that take a threshold (`METHOD@T`)."""


def check_method(name: str) -> str:
    """`name` when it is a known method (see the module doc), else a ValueError listing what is."""
    family, value = parse_method(name)
    if name in METHODS or (value is not None and (family == "ddtree" or family in ROUTED)):
        return name
    raise ValueError(f"--methods: unknown method {name!r}; choose from {', '.join(METHODS)} (or whiflash), "
                     "ddtree-bN (DDTree at budget N) or whiflash-entropy@T / whiflash-neural@T (threshold T)")


@dataclass
class Method:
    """A named way of decoding: `drafter` is passed to `whiflash.generate` (None: autoregressive)."""

    name: str
    drafter: Any
    routed: bool = False
    label: str = ""
    threshold: float | None = None
    """A routed method's threshold (None: the flag's or the router's own)."""
    pinned: int | None = None
    """The slot an infinite threshold pins (`drafter` is then that slot's drafter alone)."""
    slot_methods: tuple[str, str] | None = None
    """A routing policy's two slots as the standalone methods that draft them alone (`dflash`, `eagle3`, `ddtree`),
    which its rounds are costed against (`metrics.ROUTED_ROUND_DEFINITION`); None for the others."""


def method_names(algorithm: str, methods: str | list[str] | None, router: str,
                 tree_budgets: list[int] | tuple[int, ...] = ()) -> list[str]:
    """The method list: `methods` when given, else the one `algorithm` names; AR always first. With
    `tree_budgets`, standalone DDTree runs at each budget (`ddtree-bN`, in place of `ddtree`, else last)."""
    if methods:
        raw = [m.strip().lower() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    else:
        alg = algorithm.upper()
        if alg not in ALGORITHMS:
            raise ValueError(f"--speculative-algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        raw = [{"AR": "ar", "EAGLE3": "eagle3", "DFLASH": "dflash", "DDTREE": "ddtree", "WHIFLASH": "whiflash"}[alg]]
    if tree_budgets:
        budgets = [budget_method(b) for b in tree_budgets]
        at = raw.index("ddtree") if "ddtree" in raw else len(raw)
        raw = [*raw[:at], *budgets, *raw[at + 1:]]
    names: list[str] = ["ar"]
    for m in raw:
        if m == "whiflash":
            m = router if router in ORACLES else f"whiflash-{router}"
        check_method(m)
        if m not in names:
            names.append(m)
    return names


def model_paths(algorithm: str, model: str | None, draft: str | None, eagle_draft: str | None,
                testbed: Path | None) -> dict[str, str | None]:
    """Target, EAGLE-3 and DFlash checkpoints with upstream meaning: `--draft-name-or-path` is the
    EAGLE-3 draft under `--speculative-algorithm EAGLE3` and the DFlash draft otherwise; `--testbed`
    fills whatever is not given (`whiflash.session.model_paths`)."""
    eagle = draft if algorithm.upper() == "EAGLE3" and draft else eagle_draft
    dflash = draft if algorithm.upper() != "EAGLE3" else None
    return session.model_paths(testbed, target=model, eagle3=eagle, dflash=dflash)


class MethodFactory:
    """Loads drafters on first use and builds every requested method around one target."""

    def __init__(self, target: Any, paths: dict[str, str | None], *, pair: str = "df-e3",
                 tree_budget: int | None = None, block_size: int | None = None,
                 eagle_num_steps: int | None = None, router: str = "entropy",
                 entropy_threshold: float = 0.2, neural_router_path: str | None = None,
                 neural_threshold: float | None = None, lazy_catchup: bool = True,
                 time_catchup: bool = False, latency_profile: str | None = None, stick_tau: int | None = None,
                 tau_rule: tuple[int, int] | None = None) -> None:
        self.target, self.paths = target, paths
        self.pair = Pair.parse(pair)
        self.tree_budget, self.block_size, self.eagle_num_steps = tree_budget, block_size, eagle_num_steps
        self.router, self.entropy_threshold = router, entropy_threshold
        self.neural_router_path, self.neural_threshold = neural_router_path, neural_threshold
        self.lazy_catchup, self.time_catchup = lazy_catchup, time_catchup
        self.latency_profile, self.stick_tau, self.tau_rule = latency_profile, stick_tau, tau_rule
        self._drafters: dict[tuple[str, int | None], Any] = {}
        self._neural: Any = None

    def drafter(self, kind: str, tree_budget: int | None = None) -> Any:
        """The shared `eagle3`, `dflash` or `ddtree` drafter (DDTree reuses the DFlash checkpoint); DDTree at
        `tree_budget` (default `--ddtree-tree-budget`) is a drafter of its own for each budget."""
        budget = (tree_budget if tree_budget is not None else self.tree_budget) if kind == "ddtree" else None
        if (kind, budget) not in self._drafters:
            key = "eagle3" if kind == "eagle3" else "dflash"
            path = self.paths.get(key)
            if not path:
                flag = "--whiflash-eagle-draft (or --draft-name-or-path with EAGLE3)" if key == "eagle3" \
                    else "--draft-name-or-path"
                raise ValueError(f"method needs a {key} checkpoint: give {flag} or --testbed DIR")
            opts: dict[str, Any] = {}
            if kind == "ddtree" and budget is not None:
                opts["tree_budget"] = budget
            if kind != "eagle3" and self.block_size is not None:
                opts["block_size"] = self.block_size
            if kind == "eagle3" and self.eagle_num_steps is not None:
                opts["num_steps"] = self.eagle_num_steps
            log.info("loading %s drafter from %s%s", kind, path, f" (tree budget {budget})" if budget else "")
            self._drafters[(kind, budget)] = whiflash.load_drafter(kind, path, self.target, **opts)
        return self._drafters[(kind, budget)]

    def neural_router(self) -> Any:
        if self._neural is None:
            if not self.neural_router_path:
                raise ValueError("--whiflash-router neural needs --whiflash-neural-router-path (Hub id, folder or "
                                 ".safetensors file)")
            self._neural = whiflash.load_router(self.neural_router_path, pair=str(self.pair),
                                                tree_budget=self.pair_tree_budget(),
                                                hidden_size=self.target.config.hidden_size,
                                                device=self.target.device)
        return self._neural

    def pair_tree_budget(self) -> int | None:
        """The DDTree budget of the pair's tree slot (the flag, else the DDTree drafter's default); None
        for pairs without one."""
        if not self.pair.uses_tree:
            return None
        return self.tree_budget if self.tree_budget is not None else self.drafter("ddtree").tree_budget

    def round_times(self) -> tuple[float, float]:
        """Each slot's round time (ms) from `--whiflash-latency-profile`, for the utility oracle."""
        from whiflash.latency import LatencyProfile

        if not self.latency_profile:
            raise ValueError("the utility-oracle method needs --whiflash-latency-profile FILE: the profile JSON "
                             "`whiflash-eval profile` writes for these models on this device")
        profile = LatencyProfile.read(self.latency_profile)
        t0, t1 = (profile.round_ms(kind, self.pair_tree_budget()) for kind in self.pair.slots)
        log.info("utility oracle: round times %s / %s = %.3f / %.3f ms (%s)", *self.pair.slots, t0, t1,
                 self.latency_profile)
        return t0, t1

    def _members(self) -> dict[str, Any]:
        """The pair's member drafters and options, as RoutedDrafter and OracleDrafter take them."""
        slot0 = self.drafter("ddtree" if self.pair.uses_tree else "dflash")
        eagle = self.drafter("eagle3") if self.pair.needs_eagle3 else None
        return dict(eagle3=eagle, dflash=slot0, tree_budget=self.tree_budget if self.pair.uses_tree else None,
                    lazy_catchup=self.lazy_catchup, time_catchup=self.time_catchup)

    def routed(self, policy: Any) -> Any:
        """A RoutedDrafter over this run's pair around `policy`."""
        return whiflash.RoutedDrafter(str(self.pair), policy, stick_tau=self.stick_tau, tau_rule=self.tau_rule,
                                      **self._members())

    def oracle(self, name: str) -> Any:
        """The OracleDrafter of `oracle` or (latency-weighted) `utility-oracle` over this run's pair."""
        times = self.round_times() if name == "utility-oracle" else None
        return whiflash.OracleDrafter(str(self.pair), round_times=times, **self._members())

    def policy(self, name: str, threshold: float | None = None) -> Any:
        """The routing policy of method `name`, with `threshold` overriding the flag's value."""
        if name == "whiflash-entropy":
            return whiflash.EntropyRouter(self.entropy_threshold if threshold is None else threshold)
        if name == "whiflash-neural":
            return whiflash.NeuralPolicy(self.neural_router(), self.neural_threshold if threshold is None else threshold)
        raise ValueError(f"{name} is not a routed method")

    def build(self, name: str, threshold: float | None = None) -> Method:
        """Method `name` (see `METHODS`, and the module doc for `ddtree-bN` and `METHOD@T`)."""
        family, value = parse_method(check_method(name))
        if name == "ar":
            return Method(name, None, label=LABELS[name])
        if family == "ddtree" and value is not None:
            return Method(name, self.drafter("ddtree", int(value)), label=f"{LABELS['ddtree']} (b{int(value)})")
        if name in ("eagle3", "dflash", "ddtree"):
            return Method(name, self.drafter(name), label=LABELS[name])
        if value is not None:  # a routed method at its own threshold
            threshold, label = value, f"{LABELS[family]} @{value:g} ({self.pair})"
        else:
            label = f"{LABELS[name]} ({self.pair})"
        if name in ORACLES:
            return Method(name, self.oracle(name), routed=True, label=label)
        flag = {"whiflash-entropy": self.entropy_threshold, "whiflash-neural": self.neural_threshold}.get(family)
        pinned = pinned_slot(family, threshold if threshold is not None else flag)
        if pinned is not None:  # the decision cannot change: run that slot's drafter alone, pay no routing
            kind = self.pair.slots[pinned]
            drafter = self.drafter(kind)  # the very object its standalone method and the routed pair decode with
            return Method(name, drafter, routed=True, label=label, threshold=threshold, pinned=pinned,
                          slot_methods=self.pair.slots)
        return Method(name, self.routed(self.policy(family, threshold)), routed=True, label=label, threshold=threshold,
                      slot_methods=self.pair.slots)
