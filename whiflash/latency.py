"""The latency profile: component times of one target and its drafters on one device.

`whiflash-eval profile` writes it (`profile.json`); the `utility-oracle` method reads each slot's
round time from it, `whiflash-eval calibrate --replay` and `whiflash-train --data.latency_profile` turn
datagen rows into tokens/s with it (`whiflash.speed_oracle`).
All times are milliseconds of one call. Slot kinds are `eagle3`, `dflash` and `ddtree-b<budget>`
(DDTree reuses the DFlash model, so its catch-up is DFlash's).

    ar_step            one target decode step (1 token, logits)
    verify[w]          chain verify of w tokens (EAGLE-3: steps + 1; DFlash: the block)
    tree_verify[w]     tree verify of w nodes (DDTree budget + 1)
    draft[kind]        the drafter's proposal with an empty backlog
    round[kind]        draft[kind] + verify at that kind's width: one round, catch-up excluded
    catchup[model][n]  KV-only catch-up of a backlog of n committed rows (model: eagle3 or dflash)
    router[name]       one routing decision: entropy and neural decide inside the verify pass; neural-after-pass
                       is a neural router that reads the previous round or earlier positions, so decides after it
    floor              (weight + KV bytes) / copy bandwidth: the memory floor of an AR step

Beside the components, `meta` holds `loop_round_wall_ms` (wall time of a round of the real loop, AR, each
chain drafter and DDTree at each profiled budget, after a prompt of `context` tokens) and `loop_host_ms` (that
minus the round's components, never below 0: what the host adds; on a CPU, where the components are wall times
too, ~0). `round_ms` and `ar_ms` add that host share to the components (DDTree its own where the profile has it,
else DFlash's), so a replay prices a round as the bench's wall clock pays it: on an H200 at `small`'s shapes
the host added 23-37% to a round, more to EAGLE-3's than to DFlash's. A profile without loop rows adds 0.

With both chain drafters, `meta`'s `loop_routed_round_wall_ms` holds the same loop's round of each of them as
a slot of a df-e3 routed drafter that always picks it, deciding every round: `round_ms(kind, routed=True)` adds
what running as a pair adds to that slot's round besides that decision (`routed_extra_ms`, never below 0; DDTree
takes DFlash's), and a replay adds the decision (`router`) on the rounds its policy decides, which is how a
replayed router's rounds are priced. Drafters alone, and the speed oracle (routing that costs nothing), keep the
plain rounds.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whiflash.io import atomic_write_json

log = logging.getLogger(__name__)

__all__ = ["AFTER_PASS", "PROFILE_KIND", "LatencyProfile", "catchup_model", "slot_kind"]

AFTER_PASS = "neural-after-pass"
"""The `router` key of a neural decision made after the verify pass (`LatencyProfile.decision_ms`)."""
PROFILE_KIND = "whiflash-latency-profile"
"""The `kind` field of a profile JSON."""
VERSION = 1


def slot_kind(kind: str, tree_budget: int | None = None) -> str:
    """The profile key of a slot: `ddtree-b<budget>` for DDTree, else the drafter kind (a budget, such
    as a tree pair's, does not apply to its chain slot)."""
    if kind == "ddtree":
        if tree_budget is None:
            raise ValueError("a DDTree slot needs its tree budget to look up its round time")
        return f"ddtree-b{tree_budget}"
    return kind


def catchup_model(kind: str) -> str:
    """The model whose catch-up a slot kind pays: DDTree catches up with its DFlash model."""
    return "dflash" if kind.startswith("ddtree") else kind


@dataclass
class LatencyProfile:
    """Component latencies in milliseconds (see the module docstring); `meta` says where and how."""

    ar_step: float
    verify: dict[int, float] = field(default_factory=dict)
    tree_verify: dict[int, float] = field(default_factory=dict)
    draft: dict[str, float] = field(default_factory=dict)
    round: dict[str, float] = field(default_factory=dict)
    catchup: dict[str, dict[int, float]] = field(default_factory=dict)
    router: dict[str, float] = field(default_factory=dict)
    floor: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """device, dtype, timing, cuda_graphs, context, models, widths (and anything a writer adds)."""
    source: str = "(in memory)"
    """Where it was read from, for error messages."""

    # ------------------------------------------------------------------ queries

    def host_ms(self, kind: str) -> float:
        """What the host adds to a round of slot kind `kind` (or `ar`), from the loop rows (`meta`'s
        `loop_host_ms`; DDTree: its own budget's row, else DFlash's); 0 when the profile has none."""
        host = self.meta.get("loop_host_ms") or {}
        return float(host.get(kind, host.get(catchup_model(kind), 0.0)))

    def routed_extra_ms(self, kind: str) -> float:
        """What running as a slot of a pair adds to a round of slot kind `kind` (DDTree: DFlash's), besides the
        routing decision: the loop's round of that drafter as a routed slot minus its round alone (`meta`'s loop
        rows) and minus the decision that routed loop made every round (`meta`'s `loop_routed_decision`, a
        `router` key; `neural` where a profile does not name it), never below 0; 0 without those rows. A replay
        adds the decision where its policy makes one, so a round the policy is not asked about pays this alone."""
        model = catchup_model(kind)
        routed = (self.meta.get("loop_routed_round_wall_ms") or {}).get(model)
        alone = (self.meta.get("loop_round_wall_ms") or {}).get(model)
        if routed is None or alone is None:
            return 0.0
        decision = self.router_ms(str(self.meta.get("loop_routed_decision", "neural")))
        return max(0.0, float(routed) - float(alone) - decision)

    def round_ms(self, kind: str, tree_budget: int | None = None, routed: bool = False) -> float:
        """One round of a slot as the loop pays it: draft + verify + the host's share (catch-up excluded);
        `routed`: as a slot of a routed drafter (+ `routed_extra_ms`)."""
        key = slot_kind(kind, tree_budget)
        if key not in self.round:
            hint = f" (profile with --tree-budgets {tree_budget})" if kind == "ddtree" else ""
            raise ValueError(f"latency profile {self.source}: no round time for {key}; it has "
                             f"{', '.join(sorted(self.round)) or 'none'}{hint}")
        return self.round[key] + self.host_ms(key) + (self.routed_extra_ms(key) if routed else 0.0)

    def ar_ms(self) -> float:
        """One AR step as the loop pays it: `ar_step` + the host's share."""
        return self.ar_step + self.host_ms("ar")

    def catchup_ms(self, kind: str, rows: int) -> float:
        """Catch-up of `rows` backlog rows for a slot kind: linear between the measured backlog
        lengths, extended linearly beyond them (0 for an empty backlog)."""
        if rows <= 0:
            return 0.0
        model = catchup_model(kind)
        table = sorted(self.catchup.get(model, {}).items())
        if not table:
            raise ValueError(f"latency profile {self.source}: no catch-up times for {model}")
        (n0, t0) = table[0]
        if rows <= n0 or len(table) == 1:  # below the first point (or one point only): proportional
            return t0 * rows / n0
        for (n0, t0), (n1, t1) in zip(table, table[1:]):
            if rows <= n1:
                break
        return t0 + (t1 - t0) * (rows - n0) / (n1 - n0)  # the last segment extends past the last point

    def router_ms(self, name: str) -> float:
        """One decision of router `name` (0 when not profiled: a router costs one small kernel chain)."""
        return self.router.get(name, 0.0)

    def decision_ms(self, in_pass: bool = True) -> float:
        """One decision of a neural router as the loop pays it: `neural` when it decides inside the verify pass,
        `neural-after-pass` when not (`whiflash.routers.decides_in_pass`). A profile written before the latter
        was timed gives `neural` for both, with a warning: it underprices a router that decides after the pass."""
        if in_pass:
            return self.router_ms("neural")
        if AFTER_PASS not in self.router:
            log.warning("latency profile %s has no %r time: a router that decides after the verify pass is priced "
                        "as one that decides inside it (profile again with whiflash-eval profile)", self.source,
                        AFTER_PASS)
            return self.router_ms("neural")
        return self.router_ms(AFTER_PASS)

    def ratios(self) -> dict[str, float]:
        """Every component over one AR step (the table that transfers between devices of a kind)."""
        rows: dict[str, float] = {}
        rows.update({f"verify {w}": ms for w, ms in sorted(self.verify.items())})
        rows.update({f"tree verify {w}": ms for w, ms in sorted(self.tree_verify.items())})
        rows.update({f"draft {k}": ms for k, ms in self.draft.items()})
        rows.update({f"round {k}": ms for k, ms in self.round.items()})
        for model, per in self.catchup.items():
            rows.update({f"catch-up {model} n={n}": ms for n, ms in sorted(per.items())})
        rows.update({f"router {k}": ms for k, ms in self.router.items()})
        return {k: v / self.ar_step for k, v in rows.items()}

    def table(self) -> str:
        """A plain-text table: every component in ms and over the AR step."""
        m = self.meta
        head = (f"latency profile: {m.get('device_name', m.get('device', '?'))}, {m.get('dtype', '?')}, "
                f"{m.get('timing', '?')}, CUDA graphs {'on' if m.get('cuda_graphs') else 'off'}, "
                f"context {m.get('context', '?')}")
        floor = f" (memory floor {self.floor:.3f} ms: {self.ar_step / self.floor:.2f}x)" if self.floor else ""
        lines = [head, f"AR step {self.ar_step:.3f} ms{floor}", f"{'component':<28}{'ms':>10}{'x AR':>8}"]
        for name, ratio in self.ratios().items():
            lines.append(f"{name:<28}{ratio * self.ar_step:>10.3f}{ratio:>8.2f}")
        for kind, ms in (m.get("loop_round_wall_ms") or {}).items():  # the loop's wall time, host included
            host = (m.get("loop_host_ms") or {}).get(kind)
            lines.append(f"{'loop round ' + kind + ' (wall)':<28}{ms:>10.3f}{ms / self.ar_step:>8.2f}"
                         + (f"   host {host:.3f}" if host is not None else ""))
        for kind, ms in (m.get("loop_routed_round_wall_ms") or {}).items():  # the same round as a routed slot
            lines.append(f"{'loop round routed ' + kind:<28}{ms:>10.3f}{ms / self.ar_step:>8.2f}"
                         f"   pair +{self.routed_extra_ms(kind):.3f} beside the decision")
        return "\n".join(lines)

    # ------------------------------------------------------------------ files

    def to_json(self) -> dict[str, Any]:
        """The on-disk object (integer keys as strings, ratios included for readers of the file)."""
        ints = lambda d: {str(k): v for k, v in sorted(d.items())}  # noqa: E731
        return {"kind": PROFILE_KIND, "version": VERSION, **self.meta, "ms": {
            "ar_step": self.ar_step, "floor": self.floor, "verify": ints(self.verify),
            "tree_verify": ints(self.tree_verify), "draft": self.draft, "round": self.round,
            "catchup": {k: ints(v) for k, v in self.catchup.items()}, "router": self.router},
            "ratios": self.ratios()}

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, self.to_json())
        return path

    @classmethod
    def read(cls, path: str | Path, flag: str = "--whiflash-latency-profile") -> LatencyProfile:
        """Read and check a profile JSON; errors name `flag`, the file and what was expected."""
        try:
            obj = json.loads(Path(path).read_text())
        except OSError as err:
            raise FileNotFoundError(f"{flag} {path}: cannot read ({err.strerror}); write one with "
                                    "`whiflash-eval profile`") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{flag} {path}: not valid JSON ({err})") from None
        return cls.from_json(obj, path, flag)

    @classmethod
    def from_json(cls, obj: Any, path: str | Path = "(in memory)", flag: str = "profile") -> LatencyProfile:
        """Check and type the object `to_json` gives (read from `path`, given by `flag`)."""
        if not isinstance(obj, dict) or obj.get("kind") != PROFILE_KIND or not isinstance(obj.get("ms"), dict):
            raise ValueError(f"{flag} {path}: expected a latency profile (kind {PROFILE_KIND!r} with an 'ms' "
                             "object) as `whiflash-eval profile` writes")
        ms = obj["ms"]
        try:
            ints = lambda d: {int(k): _positive(v) for k, v in (d or {}).items()}  # noqa: E731
            prof = cls(
                ar_step=_positive(ms["ar_step"]), verify=ints(ms.get("verify")),
                tree_verify=ints(ms.get("tree_verify")),
                draft={k: _positive(v) for k, v in (ms.get("draft") or {}).items()},
                round={k: _positive(v) for k, v in (ms.get("round") or {}).items()},
                catchup={k: ints(v) for k, v in (ms.get("catchup") or {}).items()},
                router={k: float(v) for k, v in (ms.get("router") or {}).items()},
                floor=ms.get("floor"),
                meta={k: v for k, v in obj.items() if k not in ("kind", "version", "ms", "ratios")},
                source=str(path))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{flag} {path}: malformed 'ms' object ({type(err).__name__}: {err})") from None
        for rows in ("loop_round_wall_ms", "loop_routed_round_wall_ms"):  # round_ms reads them
            value = prof.meta.get(rows)
            if value is not None and not (isinstance(value, dict) and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value.values())):
                raise ValueError(f"{flag} {path}: '{rows}' must map drafter kinds to milliseconds > 0, got {value!r}")
        return prof


def _positive(value: Any) -> float:
    x = float(value)
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"time {value!r} is not a finite number of ms > 0")
    return x
