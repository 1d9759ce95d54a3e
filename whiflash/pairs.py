"""The drafter pairs a router chooses between, one type instead of strings tested by substring.

Slot 0 is the parallel (block-diffusion) drafter, slot 1 the other one. The names are the
upstream `--whiflash-drafters` values: `df-e3` (DFlash | EAGLE-3, the default), `ddt-e3`
(DDTree | EAGLE-3) and `df-ddt` (DFlash chain | DDTree tree over one shared DFlash model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SlotKind = Literal["dflash", "ddtree", "eagle3"]


@dataclass(frozen=True)
class Pair:
    """Two drafter slots; `str(pair)` is its upstream name."""

    name: str
    slots: tuple[SlotKind, SlotKind]

    def __str__(self) -> str:
        return self.name

    @property
    def uses_tree(self) -> bool:
        """Whether a DDTree slot is in the pair, so a tree budget applies (and is part of a router's identity)."""
        return "ddtree" in self.slots

    @property
    def needs_eagle3(self) -> bool:
        return "eagle3" in self.slots

    @property
    def shares_dflash(self) -> bool:
        """Both slots run the same DFlash model (and cache)."""
        return self.slots == ("dflash", "ddtree")

    @classmethod
    def parse(cls, value: str | Pair, what: str = "--whiflash-drafters") -> Pair:
        """The pair named `value`; an unknown name is an error that names `what` and the choices."""
        if isinstance(value, Pair):
            return value
        try:
            return PAIRS[value]
        except (KeyError, TypeError):
            raise ValueError(f"{what}: expected one of {', '.join(PAIRS)}, got {value!r}") from None


PAIRS: dict[str, Pair] = {
    "df-e3": Pair("df-e3", ("dflash", "eagle3")),
    "ddt-e3": Pair("ddt-e3", ("ddtree", "eagle3")),
    "df-ddt": Pair("df-ddt", ("dflash", "ddtree")),
}
"""Every pair by its upstream name (`--whiflash-drafters` values), default first."""


def tree_budget_for(pair: str | Pair, tree_budget: int | None) -> int | None:
    """The tree budget that identifies a run of `pair`: `tree_budget` for pairs with a DDTree slot, else None."""
    return tree_budget if Pair.parse(pair).uses_tree else None
