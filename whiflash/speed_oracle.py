"""The speed oracle: the tokens/s of perfect per-round routing, from datagen rows and a latency profile.

A router dataset logs both slots' τ every round of every prompt. Routing picks one slot per round;
the round then yields that slot's τ and costs what `whiflash-eval calibrate --replay` charges
(`simulate`, which `whiflash.eval.replay` uses): the chosen slot's round (draft + verify) plus its catch-up of the
rows committed since it last drafted (every drafter took in the prompt during the prefill, which the bench does not
time, so a prompt's first round catches up nothing; without Lazy Catch-up the other slot's model catches up every
round too). The oracle pays no routing decision.

Rates are the bench's headline (`headline_rate`): 1 / the mean over a category's prompts of each prompt's
time per token, as `whiflash-eval bench` divides mean AR TPOT by mean method TPOT, so every prompt weighs the
same whatever its length. The oracle's rate is then the best each prompt can do on its own: per prompt the
maximum over its per-round slot sequences of Σ τ / Σ time, found exactly:

- for a fixed price λ (ms per token), the prompt's best sequence under Σ τ - λ Σ time is a dynamic
  programme over its rounds whose state is the slot that drafted last and the other model's backlog
  (rows committed since it last drafted; the last slot's own backlog is its previous τ). A switch
  collapses every state of a slot into one, so a prompt of R rounds holds at most R + 1 states per
  slot, and with a catch-up time that does not fall with the backlog a state with a longer backlog
  and no higher value is dropped;
- Dinkelbach's iteration λ ← Σ τ / Σ time of the best sequence converges to the largest ratio
  (the optimum is reached when the best value at λ is 0).

Like the replay, this assumes a round's τ does not depend on which slot drafted earlier rounds (the
data followed the τ oracle's path) and that a prompt has the rounds it was logged with. Rows at every position
(`whiflash-datagen --path every`) drop the second assumption: a replay walks them (`walked`), and the
programme carries the position (`_best_walk`). Beside it: each standalone drafter under the same cost model
and rate (always that slot, through `simulate_prompts`), the better of them, the oracle's gain over it and
:func:`oracle_gain_share`, the share of that gain a router gets.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .latency import LatencyProfile, catchup_model, slot_kind

__all__ = ["DEFINITION", "headline_rate", "oracle_gain_share", "prompt_gains", "prompt_spans", "round_starts", "ruled",
           "simulate", "simulate_prompts", "speed_oracle", "stick", "stuck_walk"]

DEFINITION = ("speed oracle: per prompt, the slot sequence maximising its sum tau / sum time (exact dynamic programme "
              "+ Dinkelbach over the ratio), costed like the replay but with no routing decision; a category's rate "
              "= 1 / mean over its prompts of ms per token, the bench's headline (mean TPOT); best standalone: the "
              "faster single slot under the same costs and rate; share of the oracle gain = (router - best "
              "standalone) / (oracle - best standalone), in tokens/s")
"""How the speed oracle and the share of its gain are defined, written beside the figures."""

_MAX_ITERATIONS = 100


def walked(slot0: np.ndarray, cols: dict[str, np.ndarray]) -> np.ndarray:
    """The rows a decode visits over a dataset with a row at every position (`whiflash-datagen --path every`;
    rows ordered by prompt and position) when it takes slot 0 where `slot0` is True: from each prompt's first
    row it advances by the tau of the slot it takes, until it passes the prompt's last row (the decode's end)."""
    return stuck_walk(slot0, cols, None)[0]


def stuck_walk(slot0: np.ndarray, cols: dict[str, np.ndarray],
               stick_tau: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`walked` under `RoutedDrafter(stick_tau=K)`: (the rows visited, the slot-0 choice at each, whether the policy
    decided it). A round drafts with slot 0 undecided when the two rounds before it drafted with slot 0 and the
    earlier of them accepted at least K (`stick`, over a path's rows); else it takes `slot0` at its row. None: the
    policy decides every round."""
    t0, t1 = np.asarray(cols["tau_0"], dtype=np.int64), np.asarray(cols["tau_1"], dtype=np.int64)
    positions = np.asarray(cols["position"], dtype=np.int64)
    rows: list[int] = []
    took: list[bool] = []
    decided: list[bool] = []
    for lo, hi in prompt_spans(np.asarray(cols["prompt_id"])):
        if np.any(np.diff(positions[lo:hi]) != 1):
            raise ValueError(f"prompt {cols['prompt_id'][lo]}: its rows are not one per position (a path's rows, not "
                             "those of whiflash-datagen --path every)")
        i, first = lo, len(rows)
        while i < hi:
            k = len(rows)  # the rounds before this one, within the prompt: k - 1 and k - 2
            stuck = (stick_tau is not None and k - first >= 2 and took[k - 1] and took[k - 2]
                     and t0[rows[k - 2]] >= stick_tau)
            s0 = True if stuck else bool(slot0[i])
            rows.append(i)
            took.append(s0)
            decided.append(not stuck)
            i += int(t0[i] if s0 else t1[i])
    return np.array(rows, dtype=np.int64), np.array(took, dtype=bool), np.array(decided, dtype=bool)


def round_starts(prompt_id: np.ndarray, position: np.ndarray, tau_0: np.ndarray, tau_1: np.ndarray) -> np.ndarray:
    """Per row of a dataset with a row at every position (any row order), the probability that a decode starts
    a round there when a fair coin picks each round's slot: 1 at a prompt's first row, and each row passes its
    probability on, half to the row `tau_0` ahead and half to the row `tau_1` ahead.

    A decode only decides where a round starts, right after the target rejected a draft, and most positions
    are inside a run of accepted tokens that no decode decides at: rows weighted by this are the decision
    points of routed decoding, whatever mix of slots the router takes (both standalone walks are among them)."""
    order = np.lexsort((position, prompt_id))
    pid, pos = np.asarray(prompt_id)[order], np.asarray(position, dtype=np.int64)[order]
    t0, t1 = np.asarray(tau_0, dtype=np.int64)[order], np.asarray(tau_1, dtype=np.int64)[order]
    p = np.zeros(len(order))
    for lo, hi in prompt_spans(pid):
        if np.any(np.diff(pos[lo:hi]) != 1):
            raise ValueError(f"prompt {pid[lo]}: its rows are not one per position (a path's rows, not those of "
                             "whiflash-datagen --path every)")
        p[lo] = 1.0
        for i in range(lo, hi):  # forward in position order: every row's inflow is complete when it is reached
            for ahead in (t0[i], t1[i]):
                if i + ahead < hi:
                    p[i + ahead] += 0.5 * p[i]
    out = np.empty_like(p)
    out[order] = p
    return out


def simulate(slot0: np.ndarray, cols: dict[str, np.ndarray], kinds: tuple[str, str], rounds: tuple[float, float],
             profile: LatencyProfile, router_ms: float, lazy: bool = True,
             routed: np.ndarray | None = None, every: bool = False) -> tuple[int, float, int]:
    """(tokens, milliseconds, rounds) of replaying slot choices `slot0` (True: slot 0) over `cols`, all prompts
    together (`simulate_prompts` summed)."""
    tokens, ms, n = simulate_prompts(slot0, cols, kinds, rounds, profile, router_ms, lazy, routed, every)
    return int(tokens.sum()), float(ms.sum()), n


def simulate_prompts(slot0: np.ndarray, cols: dict[str, np.ndarray], kinds: tuple[str, str],
                     rounds: tuple[float, float], profile: LatencyProfile, router_ms: float, lazy: bool = True,
                     routed: np.ndarray | None = None, every: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens per prompt, milliseconds per prompt, rounds) of replaying slot choices `slot0` (True: slot 0) over
    `cols`, prompts in the rows' order; `kinds` are the slots' drafter kinds, `rounds` their round times (ms).
    `lazy=False`: the other slot's model catches up every round too (no Lazy Catch-up). `routed`: the rounds whose
    decision the policy made and paid `router_ms` for (default: all; see `stick`). `every`: `cols` has a row at
    every position, and the replay takes the rows its own choices reach (`walked`), not every row."""
    if every:
        idx = walked(slot0, cols)
        slot0, cols = np.asarray(slot0)[idx], {k: np.asarray(v)[idx] for k, v in cols.items()}
        routed = None if routed is None else np.asarray(routed)[idx]
    members = tuple(catchup_model(k) for k in kinds)  # df-ddt: both slots share one DFlash cache
    pids, positions = cols["prompt_id"], cols["position"]
    taus = np.where(slot0, cols["tau_0"], cols["tau_1"]).astype(np.int64)
    tokens: list[int] = []
    ms: list[float] = []
    pos, kv = 0, {m: 0 for m in members}
    for i in range(len(taus)):
        if i == 0 or pids[i] != pids[i - 1]:  # a new prompt: its prefill left every drafter holding the prompt
            pos = int(positions[i])
            kv = {m: pos for m in members}
            tokens.append(0)
            ms.append(0.0)
        s = 0 if slot0[i] else 1
        paid = router_ms if routed is None or routed[i] else 0.0
        ms[-1] += paid + rounds[s] + profile.catchup_ms(kinds[s], pos - kv[members[s]])
        kv[members[s]] = pos
        if not lazy and members[1 - s] != members[s]:
            ms[-1] += profile.catchup_ms(kinds[1 - s], pos - kv[members[1 - s]])
            kv[members[1 - s]] = pos
        tokens[-1] += int(taus[i])
        pos += int(taus[i])
    return np.array(tokens, dtype=np.int64), np.array(ms, dtype=np.float64), len(taus)


def headline_rate(tokens: np.ndarray, ms: np.ndarray) -> float:
    """Tokens per millisecond as the bench's headline counts them: 1 / the mean over prompts of each prompt's
    milliseconds per token (its TPOT), so a prompt weighs the same whatever its length; prompts of no tokens are
    left out. Over one prompt it is that prompt's tokens / ms."""
    tokens, ms = np.asarray(tokens, dtype=np.float64), np.asarray(ms, dtype=np.float64)
    some = tokens > 0
    if not some.any():
        raise ValueError("headline rate: no prompt has tokens")
    return float(1.0 / np.mean(ms[some] / tokens[some]))


def stick(slot0: np.ndarray, tau_0: np.ndarray, prompt_id: np.ndarray,
          stick_tau: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(slot choices, rounds the policy decided) when `RoutedDrafter(stick_tau=K)` keeps slot 0 without asking
    the policy: round r stays with slot 0 when rounds r-1 and r-2 of its prompt drafted with slot 0 and round
    r-2 accepted at least K tokens (the last tau the host has read when round r is decided). `slot0` is
    the policy's choice for every round (rows ordered by prompt and round); None: the policy decides all."""
    slot0 = np.asarray(slot0, dtype=bool)
    if stick_tau is None:
        return slot0, np.ones(len(slot0), dtype=bool)
    out, routed = slot0.copy(), np.ones(len(slot0), dtype=bool)
    for i in range(2, len(out)):
        if (prompt_id[i] == prompt_id[i - 2] and out[i - 1] and out[i - 2] and tau_0[i - 2] >= stick_tau):
            out[i], routed[i] = True, False
    return out, routed


def ruled(slot0: np.ndarray, cols: dict[str, np.ndarray], tau_rule: tuple[int, int] | None,
          every: bool = False) -> np.ndarray:
    """Slot choices of `RoutedDrafter(tau_rule=(ENTER, LEAVE))` over a policy's `slot0` (True: slot 0, one per row,
    rows ordered by prompt and round): the policy's choice at a prompt's first round, then after a round of slot 1
    with tau >= ENTER slot 0, after one of slot 0 with tau <= LEAVE slot 1, else the same slot. The next round is
    the next row of the prompt, or with `every` (a row at every position) the row the round's tau leads to; rows no
    round reaches keep the policy's choice. None: `slot0` as it is."""
    slot0 = np.asarray(slot0, dtype=bool)
    if tau_rule is None:
        return slot0
    enter, leave = tau_rule
    out, t0, t1 = slot0.copy(), np.asarray(cols["tau_0"]), np.asarray(cols["tau_1"])
    for lo, hi in prompt_spans(np.asarray(cols["prompt_id"])):
        i = lo
        while i < hi:
            tau = int(t0[i] if out[i] else t1[i])
            nxt = i + (tau if every else 1)
            if nxt < hi:
                out[nxt] = tau > leave if out[i] else tau >= enter
            i = nxt
    return out


def oracle_gain_share(router_tps: float, best_standalone_tps: float, oracle_tps: float) -> float | None:
    """(router - best standalone) / (oracle - best standalone) in tokens/s: 1 = the oracle, 0 = no better than
    the better standalone drafter, negative = slower than it. None when the oracle gains nothing (within
    1e-9 relative), where the share is undefined."""
    gain = oracle_tps - best_standalone_tps
    if not gain > 1e-9 * max(abs(best_standalone_tps), 1e-12):
        return None
    return (router_tps - best_standalone_tps) / gain


def prompt_spans(prompt_id: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) row ranges of consecutive rows of one prompt (rows ordered by prompt and round)."""
    if len(prompt_id) == 0:
        return []
    cuts = np.flatnonzero(prompt_id[1:] != prompt_id[:-1]) + 1
    return list(zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(prompt_id)].tolist()))


class _Costs:
    """Per-slot round times and integer-backlog catch-up tables of one pair under one profile."""

    def __init__(self, kinds: tuple[str, str], rounds: tuple[float, float], profile: LatencyProfile,
                 max_rows: int, lazy: bool) -> None:
        self.rounds, self.lazy = rounds, lazy
        self.shared = catchup_model(kinds[0]) == catchup_model(kinds[1])  # df-ddt: one DFlash cache
        n = np.arange(max_rows + 1)
        self.catchup = tuple([profile.catchup_ms(k, int(r)) for r in n] for k in kinds)
        # dropping dominated states is exact only while catch-up does not fall as the backlog grows
        self.monotone = all(bool(np.all(np.diff(c) >= 0)) for c in self.catchup)


def _best_path(t0: np.ndarray, t1: np.ndarray, costs: _Costs, lam: float) -> tuple[int, float, int]:
    """(tokens, ms, rounds on slot 0) of one prompt's slot sequence maximising tokens - lam * ms."""
    taus = (t0.tolist(), t1.tolist())
    cu, rr, lazy, shared = costs.catchup, costs.rounds, costs.lazy, costs.shared
    # a state: (backlog of the other model, tokens, ms, rounds on slot 0); one list per last slot. The first
    # round catches up nothing: every model took in the prompt during the prefill
    states: list[list[tuple[int, int, float, int]]] = [[], []]
    for c in (0, 1):
        tau = taus[c][0]
        states[c] = [(tau, tau, rr[c], 1 - c)]
    for t in range(1, len(taus[0])):
        new: list[list[tuple[int, int, float, int]]] = [[], []]
        for s in (0, 1):
            if not states[s]:
                continue
            c, a = 1 - s, taus[s][t - 1]  # the last slot's own backlog is the tau it committed
            # keep drafting with s
            tau = taus[s][t]
            for b, tok, ms, n0 in states[s]:
                extra = cu[c][b] if not lazy and not shared else 0.0
                new[s].append((b + tau if lazy else tau, tok + tau, ms + rr[s] + cu[s][a] + extra, n0 + (s == 0)))
            # switch to c: it catches up its backlog (the shared cache: the last tau); s catches up too without lazy
            tau = taus[c][t]
            best, best_v = None, -np.inf
            for b, tok, ms, n0 in states[s]:
                step = rr[c] + (cu[c][a] if shared else cu[c][b]) + (cu[s][a] if not lazy and not shared else 0.0)
                v = tok + tau - lam * (ms + step)
                if v > best_v:
                    best, best_v = (a + tau if lazy else tau, tok + tau, ms + step, n0 + (c == 0)), v
            new[c].append(best)
        states = [_prune(new[s], lam, costs.monotone or not lazy or shared) for s in (0, 1)]
    final = [st for per in states for st in per]
    tok, ms, n0 = max(final, key=lambda st: st[1] - lam * st[2])[1:]
    return tok, ms, n0


def _best_walk(t0: np.ndarray, t1: np.ndarray, costs: _Costs, lam: float) -> tuple[int, float, int, int]:
    """(tokens, ms, rounds on slot 0, rounds) of the slot sequence maximising tokens - lam * ms over one prompt's
    rows at every position (`--path every`): a round at row `n` with slot `c` goes on at row `n + tau_c[n]`, and
    the prompt ends past its last row. `_best_path`'s programme with the position in the state: one state set per
    (row, last slot, that slot's own backlog), the other model's backlog and the totals in each state."""
    taus = (t0.tolist(), t1.tolist())
    rows, cu, rr, lazy, shared = len(taus[0]), costs.catchup, costs.rounds, costs.lazy, costs.shared
    dominance = costs.monotone or not lazy or shared
    # at[n][(last slot, its backlog)]: states (backlog of the other model, tokens, ms, rounds on slot 0, rounds)
    at: list[dict[tuple[int, int], list[tuple[int, int, float, int, int]]]] = [{} for _ in range(rows)]
    final: list[tuple[int, int, float, int, int]] = []

    def put(n: int, key: tuple[int, int], state: tuple[int, int, float, int, int]) -> None:
        (at[n].setdefault(key, []) if n < rows else final).append(state)

    for c in (0, 1):  # the first round: every model took in the prompt during the prefill, no catch-up
        tau = taus[c][0]
        put(tau, (c, tau), (tau, tau, rr[c], 1 - c, 1))
    for n in range(1, rows):
        for (s, a), states in at[n].items():
            states = _prune(states, lam, dominance)
            c, tau = 1 - s, taus[s][n]
            for b, tok, ms, n0, r in states:  # keep drafting with s
                extra = cu[c][b] if not lazy and not shared else 0.0
                put(n + tau, (s, tau), (b + tau if lazy else tau, tok + tau, ms + rr[s] + cu[s][a] + extra,
                                        n0 + (s == 0), r + 1))
            tau = taus[c][n]  # switch to c: one state, the best (the other's backlog is then a + tau)
            best, best_v = None, -np.inf
            for b, tok, ms, n0, r in states:
                step = rr[c] + (cu[c][a] if shared else cu[c][b]) + (cu[s][a] if not lazy and not shared else 0.0)
                if tok + tau - lam * (ms + step) > best_v:
                    best_v, best = tok + tau - lam * (ms + step), (a + tau if lazy else tau, tok + tau, ms + step,
                                                                    n0 + (c == 0), r + 1)
            put(n + tau, (c, tau), best)
        at[n] = {}  # done with this row
    tok, ms, n0, r = max(final, key=lambda st: st[1] - lam * st[2])[1:]
    return tok, ms, n0, r


def _prune(states: list[tuple[Any, ...]], lam: float, dominance: bool) -> list[tuple[Any, ...]]:
    """The states `(backlog, tokens, ms, ...)` worth keeping: the best per backlog, and with `dominance` only those
    whose value beats every state of a shorter backlog (a longer backlog can only cost more later)."""
    best: dict[int, tuple[Any, ...]] = {}
    for st in states:
        old = best.get(st[0])
        if old is None or st[1] - lam * st[2] > old[1] - lam * old[2]:
            best[st[0]] = st
    if not dominance:
        return list(best.values())
    kept, top = [], -np.inf
    for b in sorted(best):
        v = best[b][1] - lam * best[b][2]
        if v > top:
            kept.append(best[b])
            top = v
    return kept


def _oracle_ratio(lo: int, hi: int, cols: dict[str, np.ndarray], costs: _Costs,
                  lam: float, every: bool = False) -> tuple[int, float, int, int, int]:
    """(tokens, ms, rounds on slot 0, rounds, iterations) of the slot sequence of the most tokens per ms over one
    prompt's rows `lo:hi`, starting from the feasible price `lam` (tokens per ms); `every`: the rows are one per
    position (`_best_walk`)."""
    t0, t1 = cols["tau_0"][lo:hi], cols["tau_1"][lo:hi]
    for it in range(1, _MAX_ITERATIONS + 1):
        if every:
            tok, ms, n0, rounds = _best_walk(t0, t1, costs, lam)
        else:
            (tok, ms, n0), rounds = _best_path(t0, t1, costs, lam), hi - lo
        if tok - lam * ms <= 1e-9 * max(tok, 1):  # no sequence beats the price: it is the optimum
            return tok, ms, n0, rounds, it
        lam = tok / ms
    raise RuntimeError(f"speed oracle: Dinkelbach did not converge in {_MAX_ITERATIONS} iterations")


def _prepared(cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile, tree_budget: int | None,
              lazy: bool) -> tuple[dict[str, np.ndarray], list[tuple[int, int]], _Costs]:
    """`cols` with integer taus and positions, its prompts' row spans and the pair's cost tables."""
    rounds = tuple(profile.round_ms(k, tree_budget) for k in kinds)
    spans = prompt_spans(np.asarray(cols["prompt_id"]))
    if not spans:
        raise ValueError("speed oracle: no rows")
    t0, t1 = np.asarray(cols["tau_0"], np.int64), np.asarray(cols["tau_1"], np.int64)
    cols = {**cols, "prompt_id": np.asarray(cols["prompt_id"]), "tau_0": t0, "tau_1": t1,
            "position": np.asarray(cols["position"], np.int64)}
    longest = max(int(cols["position"][lo]) + int(np.maximum(t0[lo:hi], t1[lo:hi]).sum()) for lo, hi in spans)
    return cols, spans, _Costs(kinds, rounds, profile, longest, lazy)


def _per_prompt(cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile,
                spans: list[tuple[int, int]], costs: _Costs, every: bool) -> dict[str, np.ndarray]:
    """Per prompt (`spans` order): each slot alone (`tokens_0`, `ms_0`, `tokens_1`, `ms_1`) and the oracle
    (`tokens`, `ms`, `slot0` rounds, `rounds`, Dinkelbach `iterations`), each prompt's slot sequence of the most
    tokens per ms."""
    part = {k: cols[k] for k in ("prompt_id", "position", "tau_0", "tau_1")}
    out: dict[str, np.ndarray] = {}
    for s in (0, 1):
        out[f"tokens_{s}"], out[f"ms_{s}"], _ = simulate_prompts(np.full(len(part["tau_0"]), s == 0), part, kinds,
                                                                 costs.rounds, profile, 0.0, costs.lazy, every=every)
    start = np.maximum(out["tokens_0"] / out["ms_0"], out["tokens_1"] / out["ms_1"])  # feasible: a slot alone
    found = np.array([_oracle_ratio(lo, hi, cols, costs, float(lam), every) for (lo, hi), lam in zip(spans, start)])
    for j, name in enumerate(("tokens", "ms", "slot0", "rounds", "iterations")):
        out[name] = found[:, j]
    return out


def _gains_by_prompt(per: dict[str, np.ndarray], sel: np.ndarray, slot: int,
                     names: list[str]) -> list[dict[str, Any]]:
    """Which of the prompts `sel` (indices into `per`) the oracle's gain over drafter `slot` alone comes from: the
    headline rate is 1 / mean TPOT, so that gain is the sum of how much the oracle cuts each prompt's ms per token
    (never below zero: the drafter alone is one of its choices), and a prompt's `share` is its part of the sum.
    Each entry: `prompt_id`, `share`, `gain` (the oracle's tokens per ms on that prompt over the drafter's, - 1)
    and `tokens` (the drafter's); largest share first; none where the oracle cuts nothing."""
    tok, ms = per[f"tokens_{slot}"][sel], per[f"ms_{slot}"][sel]
    cut = np.maximum(ms / tok - per["ms"][sel] / per["tokens"][sel], 0.0)
    if cut.sum() <= 0:
        return []
    return sorted(({"prompt_id": names[p], "share": float(c / cut.sum()),
                    "gain": float((per["tokens"][p] / per["ms"][p]) / (t / m) - 1.0), "tokens": int(t)}
                   for p, c, t, m in zip(sel, cut, tok, ms)), key=lambda e: -e["share"])


def speed_oracle(cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile,
                 tree_budget: int | None = None, lazy: bool = True, every: bool = False,
                 by_prompt: bool = False) -> dict[str, Any]:
    """Per category (and `all`): the speed oracle, both standalone drafters and the oracle's gain.

    `cols` holds `prompt_id`, `category`, `position`, `tau_0`, `tau_1`, rows ordered by prompt and round;
    `kinds` are the slots' drafter kinds. Rates are the bench's headline (`headline_rate`: 1 / mean over prompts of
    ms per token), so the oracle is each prompt's own best sequence. Each entry: `tokens_per_second` and `speedup`
    (over one token per AR step) of the oracle, its `tau` and `slot0_rounds` share (pooled over its rounds),
    `standalone` tokens/s per slot, `best_standalone` (`slot0`/`slot1`) with its
    `best_standalone_tokens_per_second`, and `oracle_gain` = oracle / best standalone - 1; with `by_prompt` also
    `gain_by_prompt`, which prompts that gain comes from (`prompt_gains`). `every`: `cols` has a row at every
    position; each standalone drafter walks its own path over them (`walked`), and the oracle's programme takes
    each round's position from the taus of the slots it picks (`_best_walk`): perfect routing over every path, not
    over one path's rows."""
    cols, spans, costs = _prepared(cols, kinds, profile, tree_budget, lazy)
    per = _per_prompt(cols, kinds, profile, spans, costs, every)
    category = np.array([cols["category"][lo] for lo, _ in spans])
    names = [str(cols["prompt_id"][lo]) for lo, _ in spans]
    out: dict[str, Any] = {}
    for cat in [*sorted(set(category.tolist())), "all"]:
        sel = np.flatnonzero(np.ones(len(spans), bool) if cat == "all" else category == cat)
        alone = {f"slot{s}": headline_rate(per[f"tokens_{s}"][sel], per[f"ms_{s}"][sel]) * 1e3 for s in (0, 1)}
        best = max(alone, key=lambda k: alone[k])
        tokens, n = per["tokens"][sel], per["rounds"][sel].sum()
        tps = headline_rate(tokens, per["ms"][sel]) * 1e3
        out[cat] = {"tokens_per_second": tps, "speedup": tps * profile.ar_ms() / 1e3, "tau": tokens.sum() / n,
                    "slot0_rounds": per["slot0"][sel].sum() / n, "rounds": int(n), "standalone": alone,
                    "best_standalone": best, "best_standalone_tokens_per_second": alone[best],
                    "oracle_gain": tps / alone[best] - 1.0, "iterations": int(per["iterations"][sel].max())}
        if by_prompt:
            slot = 0 if best == "slot0" else 1
            out[cat]["gain_by_prompt"] = _gains_by_prompt(per, sel, slot, names) if out[cat]["oracle_gain"] > 0 else []
    return {"slots": [slot_kind(k, tree_budget) for k in kinds], "lazy_catchup": lazy, "definition": DEFINITION,
            "categories": out}


def prompt_gains(cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile,
                 tree_budget: int | None = None, lazy: bool = True,
                 every: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Per category (and `all`): which prompts the speed oracle's gain over the better standalone drafter comes
    from (`_gains_by_prompt`'s entries); a category where the oracle gains nothing has none. Arguments as
    `speed_oracle`, which gives the same lists beside its figures with `by_prompt`."""
    res = speed_oracle(cols, kinds, profile, tree_budget, lazy, every, by_prompt=True)["categories"]
    return {cat: r["gain_by_prompt"] for cat, r in res.items()}
