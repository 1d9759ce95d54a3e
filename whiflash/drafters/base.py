"""The interface every drafter implements, and the messages it exchanges with the loop.

A drafter sees the decoding state only through `observe` (features of newly committed
positions, docs/design.md "The round") and `propose` (draft continuations of the pending
token). `observe` only queues work: the features wait in a backlog until the next `propose`
consumes them in one batched prefill. The prompt's features are taken in by `prefill`, inside the
loop's prefill. A single drafter catches up every round; in routed decoding the inactive drafter's
backlog simply grows until it is chosen again (Lazy Catch-up).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from whiflash.runtime.graphs import FixedShapePasses


@dataclass
class Proposal:
    """Draft nodes after the pending (root) token. A chain when `parents` is None."""

    tokens: Tensor
    """`[m]` target-vocabulary ids of the drafted nodes."""
    parents: Tensor | None = None
    """`[m]` index of each node's parent in `[root, node_0, ...]` (0 is the root); None for a chain."""
    depths: Tensor | None = None
    """`[m]` depth of each node (the root has depth 0); None for a chain."""
    tree_mask: Tensor | None = None
    """`[m+1, m+1]` ancestor-or-self visibility over `[root, nodes]`; None for a chain."""
    branch: int | None = None
    """The union of two slots' drafts (the oracle): how many nodes, first, are slot 0's; else None."""

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class Commit:
    """Newly committed positions `start .. start+n-1`, as one verify pass saw them."""

    feats: Tensor
    """`[n, len(taps), H]` target tap-layer outputs at the committed positions."""
    next_tokens: Tensor
    """`[n]` the token that follows each committed position (the last one is the new pending token)."""
    start: int
    """Absolute position of the first committed row."""
    taps: tuple[int, ...]
    """Target layers of `feats`' second axis."""


def concat_commits(commits: list[Commit]) -> Commit:
    """Merge a backlog of consecutive commits into one batched prefill."""
    if len(commits) == 1:
        return commits[0]
    return Commit(
        feats=torch.cat([c.feats for c in commits]),
        next_tokens=torch.cat([c.next_tokens for c in commits]),
        start=commits[0].start,
        taps=commits[0].taps,
    )


@dataclass(slots=True)
class SequenceState:
    """What a drafter updates every round, kept in a plain object: an attribute set on the drafter itself (an
    `nn.Module`) goes through `Module.__setattr__`, whose parameter, buffer and submodule checks cost a few
    microseconds of host time each. A drafter class with more per-round fields subclasses it (`Drafter.State`)."""

    backlog: list[Commit] = field(default_factory=list)
    """Commits observed and not yet consumed by a catch-up."""
    kv_len: int = 0
    """Committed positions whose K/V the drafter holds."""
    last: tuple[Tensor, Tensor] | None = None
    """What a catch-up leaves for the next draft (EAGLE-3: its last row's output and logits)."""


class Drafter(nn.Module, FixedShapePasses):
    """Base class: backlog handling shared by all drafters; fixed-shape passes as the target's."""

    kind: str = ""
    tap_layers: tuple[int, ...] = ()
    State: type[SequenceState] = SequenceState
    """The per-sequence state `__init__` and `reset` make fresh."""

    def __init__(self) -> None:
        super().__init__()
        self._seq = self.State()
        self._target: tuple[Any, ...] = ()  # a tuple, so nn.Module does not adopt the target as a submodule
        self.static, self.graphs = False, None  # fixed-shape drafting passes (implied by CUDA graphs)
        self._tap_index: dict[tuple[tuple[int, ...], torch.device], Tensor] = {}

    @property
    def backlog(self) -> list[Commit]:
        """Commits observed and not yet consumed (`observe`, `take_backlog`)."""
        return self._seq.backlog

    @property
    def kv_len(self) -> int:
        """Committed positions whose K/V this drafter holds."""
        return self._seq.kv_len

    @kv_len.setter
    def kv_len(self, value: int) -> None:
        self._seq.kv_len = value

    @property
    def target(self) -> Any:
        """The target this drafter runs against (its embedding and LM head; set by `reset`)."""
        return self._target[0] if self._target else None

    @property
    def max_nodes(self) -> int:
        """Largest proposal (nodes after the root) this drafter makes; sizes the target's verify pass."""
        return self.draft_length

    @property
    def draft_length(self) -> int:
        """Nodes of this drafter's chain draft (EAGLE-3 steps, DFlash block - 1)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The method's name in statistics and tables."""
        return self.kind

    def reset(self, target: Any, max_len: int, temperature: float = 0.0) -> None:
        """Start a new sequence: forget the backlog, take the target's `EngineOptions` (kernels, compiled
        passes, CUDA graphs) and (re)size the cache for `max_len` positions."""
        if self._target and self._target[0] is not target:
            self.drop_graphs()  # captured passes read the old target's weights (LM head, embeddings) in place
        self._target = (target,)
        self.set_engine(target.engine)
        self._seq = self.State()
        self._setup_cache(max_len)

    def _setup_cache(self, max_len: int) -> None:
        raise NotImplementedError

    def observe(self, commit: Commit) -> None:
        """Queue newly committed positions; nothing is computed until the next `propose`."""
        self._seq.backlog.append(commit)

    @property
    def backlog_len(self) -> int:
        return sum(int(c.next_tokens.shape[0]) for c in self._seq.backlog)

    def take_backlog(self) -> Commit | None:
        seq = self._seq
        if not seq.backlog:
            return None
        commit = concat_commits(seq.backlog)
        seq.backlog = []
        if commit.start != seq.kv_len:
            raise RuntimeError(f"{self.kind}: backlog starts at {commit.start} but the cache holds {seq.kv_len}")
        return commit

    def select_taps(self, commit: Commit) -> Tensor:
        """`[n, len(self.tap_layers) * H]`: this drafter's layers, concatenated low to high as in training."""
        index = tuple(commit.taps.index(layer) for layer in self.tap_layers)
        if index == tuple(range(index[0], index[0] + len(index))):  # a run of the committed taps: a view
            return commit.feats[:, index[0] : index[0] + len(index)].flatten(1)
        # a device index made once: indexing with a Python list copies it to the device on every call
        key = (index, commit.feats.device)
        if key not in self._tap_index:
            self._tap_index[key] = torch.tensor(index, device=commit.feats.device)
        return commit.feats.index_select(1, self._tap_index[key]).flatten(1)

    @property
    def catch_up_rows(self) -> int:
        """Rows of a usual fixed-shape catch-up pass: the most that one round commits."""
        raise NotImplementedError

    def catch_up_passes(self, n: int) -> tuple[int, range]:
        """(rows per pass, pass offsets) for a fixed-shape catch-up of `n` backlog rows.

        One pass of `catch_up_rows` for a backlog of one round; passes 4x as wide for the long
        backlogs that lazy switching leaves. Two captured shapes in all; caches keep
        `4 * catch_up_rows` spare slots for the padded tail of the last pass.
        """
        c = self.catch_up_rows if n <= self.catch_up_rows else 4 * self.catch_up_rows
        return c, range(0, n, c)

    def catch_up(self) -> None:
        """Consume the whole backlog now (used by eager per-round updates in routed decoding)."""
        raise NotImplementedError

    def prefill(self) -> None:
        """Take in the prompt now, as part of the prefill: consume the backlog its commit left. Upstream's
        decode time starts after the drafter's one-time pass over the prompt; a pair takes it in with every
        member, so a switch catches up only the rows committed since that member last drafted."""
        if self.backlog:
            self.catch_up()

    def propose(self, pending: Tensor, pos: int, slot: int = 0) -> Proposal:
        """Draft continuations of the `pending` token, which sits at absolute position `pos`.

        `slot` picks the member that drafts, for drafters that hold two (routed decoding); a
        single drafter has slot 0 only."""
        raise NotImplementedError

    def taus(self, taps: Tensor, ids: Tensor, starts: Tensor, tree_budget: int | None = None) -> Tensor:
        """`[R]` tau this drafter reaches at each pending position of `starts [R]` of the greedy sequence `ids [N]`,
        computed in parallel passes instead of rounds (datagen's `--parallel`; the drafter must be `reset`);
        `tree_budget`: of the tree of that many nodes, for drafters that draft trees (`draft`).

        `taps [N, k*T]` are this drafter's target features of one causal pass over `ids` (`select_taps`), and `ids`
        reaches past every draft (`starts.max() + draft_length < N`). The drafter sees what a round at `n` would:
        the committed rows before `n`. Teacher forcing is exact at T = 0: up to its first miss a draft is the
        sequence (verification accepts exactly the target's greedy tokens), so feeding the sequence's tokens gives
        the same leading matches; tau is 1 + their count (a tree's: the depth of its deepest node on the
        sequence)."""
        raise NotImplementedError

    def draft(self, pending: Tensor, pos: int, tree_budget: int | None = None) -> Proposal:
        """A chain (`tree_budget` None) or a tree of `tree_budget` nodes: how a routed slot asks its
        member for a proposal. Chain-only drafters refuse a budget."""
        if tree_budget is not None:
            raise ValueError(f"{self.kind}: drafts chains only, not a tree of {tree_budget} nodes")
        return self.propose(pending, pos)

    def backlog_rows(self, slot: int = 0) -> int:
        """Committed rows waiting in the backlog of the member that drafts for `slot`."""
        return self.backlog_len

    # The hooks the round loop (`whiflash.decoding.loop.generate`) calls, with what a single drafter does.

    catchup_seconds: float = 0.0
    """Seconds spent consuming backlogs since `reset` (routed drafters that time their catch-up; else 0)."""

    routes: bool = False
    """True for a drafter whose `route` decides: the loop asks it every round (and gathers the decision
    point's hidden state and logits for it); False: `route` is not called after a round."""

    reads_state: bool = True
    """Whether `route` after a round reads the decision point's hidden state and logits; False: the loop passes
    None for them and gathers neither (two operations a round fewer)."""

    def route(self, hidden: Tensor | None, logits: Tensor | None, tau: Tensor | None = None,
              decided: Tensor | None = None, path: tuple[Tensor, Tensor] | None = None) -> Tensor | int | None:
        """The routing decision: the next round's slot (0-dim long, on the device) from the target's final
        hidden state `[H]` and logits `[V]` at the last committed position, or None for a drafter without a
        routing policy (it always drafts with slot 0); a plain int where the host knows the slot without the
        device (no op dispatched, nothing read back for it). `tau`: the round just verified (0-dim, on the device);
        None after the prefill. `decided`: the slot `row_policy` already chose inside the verify pass (then
        `hidden` and `logits` are None). `path`: the verify pass's hidden states `[m+1, H]` and the node order
        whose first `tau` entries are the committed path (`verify.accept`'s `keep`), for a policy that reads the
        positions before the decision point."""
        return None

    @property
    def row_policy(self) -> Any:
        """A policy the target's verify pass runs for every row (`Target.forward(route=)`), or None: routed
        drafters whose policy decides from the position alone, so the decision is captured with the pass."""
        return None

    def advance(self, taus: Tensor) -> Tensor:
        """The branch choice for a union proposal (`Proposal.branch`): the 0-dim long slot (on the device) whose
        branch the round accepts, from both slots' `[2]` taus. Default: the larger tau, ties slot 1."""
        return (taus[0] <= taus[1]).long()


def write_checkpoint(folder: str | Path, config: dict[str, Any], state: dict[str, Tensor]) -> Path:
    """Write `config.json` + `model.safetensors` (the upstream drafter layout)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # clone: stacked projections hand their parts out as views of one tensor, which safetensors refuses
    save_file({k: v.detach().cpu().clone() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder
