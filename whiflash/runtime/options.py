"""`EngineOptions`: every switch of the decoding engine in one frozen object, owned by the target.

The target holds one (`Target.set_engine`), and every drafter takes its target's when it attaches
(`Drafter.reset`), so a run's kernels, compiled stages, CUDA graphs and tree checks are chosen in one
place and can be written down as they are (`to_dict`, the run manifests' `engine`). The defaults are
the fastest path the GPU tests cover for the kernels and the eager path for everything that must be
asked for (compiled layers, CUDA graphs); `from_environment` starts from the ``WHIFLASH_*`` variables
(`whiflash.settings`) instead, which is how the command-line tools and `load_target` pick theirs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from whiflash import settings

__all__ = ["EngineOptions"]


@dataclass(frozen=True)
class EngineOptions:
    """How the target and its drafters run their passes (the output is the same under every choice)."""

    attention_kernel: bool = True
    """Fixed-shape passes on the GPU attend through the split-K Triton kernel where it is usable
    (`decode_attention.usable`); off: PyTorch's SDPA everywhere."""
    gemv: bool = True
    """Few-row weight products on the GPU go through the Triton GEMV kernel where it is usable (`gemv.usable`);
    off: cuBLAS for every product."""
    gemv_configs: str | None = None
    """A `scripts/bench_gemv.py --json` file of per-shape launch settings added to the built-in table (a GPU of
    another kind than the one the table was measured on)."""
    tree_kernel: bool = True
    """DDTree's tree (its top-k and its builder) comes from Triton kernels where they can run; off: log-softmax,
    `topk` and sort-based ops."""
    compiled_layers: bool = False
    """Fixed-shape passes run their layer stages and the drafters' own passes through torch.compile."""
    compile_backend: str = "inductor"
    """torch.compile's backend for `compiled_layers` (`aot_eager` captures without code generation: the CPU tests)."""
    cuda_graphs: bool = False
    """Fixed-shape passes are captured as CUDA graphs on first use and replayed (needs a CUDA device)."""
    check_trees: bool = False
    """Check every verified tree's shape (`verify.check_tree`) before walking it: one extra host read a round."""

    @classmethod
    def from_environment(cls, **overrides: Any) -> EngineOptions:
        """The defaults with what the ``WHIFLASH_*`` variables set (`settings.engine_defaults`), then `overrides`."""
        return cls(**{**settings.engine_defaults(), **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (JSON-ready): the `engine` record of a run manifest."""
        return asdict(self)

    def with_(self, **changes: Any) -> EngineOptions:
        """A copy with `changes` (field names as keywords); an unknown name is refused, naming the known ones."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"EngineOptions has no field {', '.join(unknown)}; expected one of {', '.join(sorted(known))}")
        return replace(self, **changes)
