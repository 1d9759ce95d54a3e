"""DDTree: DFlash drafting verified as a tree of the `B` most probable prefixes (`whiflash.drafters.trees`)."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from whiflash.drafters.base import Proposal
from whiflash.drafters.dflash import DFlashDrafter


class DDTreeDrafter(DFlashDrafter):
    """DFlash drafting verified as a tree of `tree_budget` nodes."""

    kind = "ddtree"

    def __init__(self, cfg: dict[str, Any], block_size: int | None = None, tree_budget: int | None = None) -> None:
        super().__init__(cfg, block_size)
        self.tree_budget = int(tree_budget if tree_budget is not None else self.block_size - 1)
        if self.tree_budget < 1:
            raise ValueError(f"ddtree: tree_budget must be >= 1, got {self.tree_budget}")

    @classmethod
    def over(cls, dflash: DFlashDrafter, tree_budget: int) -> DDTreeDrafter:
        """A DDTree drafter of `tree_budget` nodes on `dflash`'s own weights (shared, not copied), with a cache and
        graphs of its own and the DFlash drafter's engine and fixed-shape mode: DDTree rounds beside a loaded DFlash
        drafter without loading its checkpoint again."""
        with torch.device("meta"):  # no weights of its own: the DFlash drafter's are assigned below
            tree = cls(dflash.cfg, dflash.block_size, tree_budget)
        tree.load_state_dict(dflash.state_dict(), assign=True)
        tree.set_engine(dflash.engine)
        tree.static = dflash.static
        return tree.train(dflash.training)

    @property
    def max_nodes(self) -> int:
        return self.tree_budget

    def taus(self, taps: Tensor, ids: Tensor, starts: Tensor, tree_budget: int | None = None) -> Tensor:
        return super().taus(taps, ids, starts, self.tree_budget if tree_budget is None else tree_budget)

    def propose(self, pending: Tensor, pos: int, slot: int = 0) -> Proposal:
        return self.draft(pending, pos, self.tree_budget)
