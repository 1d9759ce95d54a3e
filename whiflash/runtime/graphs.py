"""Fixed-shape passes, run directly or replayed as CUDA graphs (docs/design.md, "Performance").

`Graphed(fn, *example_inputs)` copies the inputs into static buffers, warms `fn` up on a side
stream, captures one call, and from then on `graphed(*inputs)` is a handful of `copy_` kernels
and one graph replay: no Python per layer and no kernel launches to pay for. Outputs are the
graph's own static tensors, overwritten by the next replay; callers consume (or copy) them
before replaying again. Static inputs must keep their shapes; values change freely. A graph whose
inputs are another graph's outputs (`alias=True`: the target's pass is two graphs, `Target._fixed`)
reads them in place instead.

`FixedShapePasses` is the one runner the target and the drafters share: it holds the model's
`EngineOptions`, chooses between the eager path and fixed shapes, and keeps one captured graph per
pass key. `one_off_work()` counts the graphs captured and passes compiled so far in the process: read around
a timed decode, it says whether that decode paid for one inside its timing.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor

from whiflash.runtime import layers
from whiflash.runtime.options import EngineOptions

F = TypeVar("F", bound=Callable[..., Any])


def without_grad(fn: F) -> F:
    """`torch.no_grad()` for a method the decode loop calls every round: the context is entered only when grad
    mode is on. `generate` already holds no_grad, and torch's decorator costs ~2.4 us of host time a call on
    this project's CPU even then (a new context object, two grad-mode switches)."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)
    return call  # type: ignore[return-value]


class Prefix(NamedTuple):
    """A pass input of `rows` rows given by its first ones, `x`: the rest is padding whose values the pass must not
    depend on (rows it writes where nothing reads them before they are overwritten: a catch-up shorter than its
    fixed width). A graph replay copies `x` over its static input's first rows and leaves the rest as the last
    call did; a direct run (and the capture) gets zero rows appended. The padding costs no allocation, fill or
    concatenation a round on the GPU."""

    x: Tensor
    rows: int

    def padded(self) -> Tensor:
        """`x` with zero rows appended up to `rows`."""
        n = self.x.shape[0]
        if n > self.rows:
            raise ValueError(f"a fixed-shape pass of {self.rows} rows got {n}")
        return self.x if n == self.rows else torch.cat([self.x, self.x.new_zeros((self.rows - n, *self.x.shape[1:]))])


def copy_inputs(statics: list[Tensor], inputs: tuple[Tensor | Prefix, ...]) -> None:
    """A replay's inputs into the graph's static ones: a `Prefix` over the first rows only, a static input itself
    (an aliased one) not at all."""
    for static, x in zip(statics, inputs):
        if isinstance(x, Prefix):
            static[: x.x.shape[0]].copy_(x.x, non_blocking=True)
        elif static is not x:
            static.copy_(x, non_blocking=True)


_ONE_OFF = {"graphs_captured": 0, "passes_compiled": 0}


def one_off_work() -> dict[str, int]:
    """How many CUDA graphs this process has captured and fixed-shape passes it has compiled so far (a copy)."""
    return dict(_ONE_OFF)


class Graphed:
    """A captured `fn(*tensors)`; replay with new input values of the same shapes (or `Prefix`es of them)."""

    def __init__(self, fn: Callable[..., Any], *example_inputs: Tensor, warmup: int = 2, alias: bool = False) -> None:
        _ONE_OFF["graphs_captured"] += 1
        # alias: the inputs are themselves static (another graph's outputs), read in place, never copied
        self.inputs = list(example_inputs) if alias else [x.clone() for x in example_inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(warmup):  # lets lazy initialisation (cuBLAS handles, workspaces) happen outside capture
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # each graph keeps its own memory pool: a pool shared across graphs must outlive every one
        # of them, and graphs are dropped and recaptured when a cache is resized
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.outputs = fn(*self.inputs)

    def __call__(self, *inputs: Tensor | Prefix) -> Any:
        copy_inputs(self.inputs, inputs)
        self.graph.replay()
        return self.outputs


class FixedShapePasses:
    """Engine options, mode and graph cache of a model's fixed-shape passes (a mixin of the target and the
    drafters, which are `nn.Module`s).

    `set_engine(options)` applies an `EngineOptions` (kernels, compiled layers, CUDA graphs);
    `static = True` runs fixed-shape passes directly (the CPU check of what graphs capture);
    `use_cuda_graphs(True)` captures each pass on first use and replays it afterwards.
    """

    static: bool = False
    graphs: dict[Hashable, Graphed] | None = None
    engine: EngineOptions = EngineOptions()
    kernels: layers.Kernels = layers.kernels_for(EngineOptions())

    def set_engine(self, options: EngineOptions) -> None:
        """Run this model's passes under `options`: its layer modules' kernels, torch.compile for fixed-shape
        passes and CUDA graphs as `options` say. Captured graphs and compiled passes are dropped when
        anything changes (they hold the old choice)."""
        if options == self.engine:
            return
        layers.use_kernels(self, options)  # type: ignore[arg-type]
        self.kernels = layers.kernels_for(options)
        self.__dict__.pop("_compiled_passes", None)
        if options.cuda_graphs != self.engine.cuda_graphs:
            self.use_cuda_graphs(options.cuda_graphs)
        else:  # the mode stays as it is (a caller may have set it by hand), its graphs go
            self.drop_graphs()
        self.engine = options

    @property
    def fixed_shapes(self) -> bool:
        """True when passes run at fixed shapes (static mode or CUDA graphs)."""
        return self.static or self.graphs is not None

    def use_cuda_graphs(self, enabled: bool = True) -> None:
        """Replay captured CUDA graphs for the fixed-shape passes (captured on first use)."""
        device = self.graph_device
        if enabled and device is not None and device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, it is on {device}")
        self.graphs = {} if enabled else None

    @property
    def graph_device(self) -> torch.device | None:
        """The device the passes run on (None: not known yet)."""
        return None

    def drop_graphs(self) -> None:
        """Forget captured graphs (they point at buffers that were just reallocated)."""
        if self.graphs:
            self.graphs = {}

    def run_fixed(self, key: Hashable, fn: Callable[..., Any], *inputs: Tensor | Prefix, compile: bool = False,
                  alias_inputs: bool = False) -> Any:
        """Run a fixed-shape pass: directly, or as the CUDA graph `key` (captured on first use). An input may be a
        `Prefix` of the rows the pass is fixed at.

        `compile`: the whole pass goes through torch.compile under `EngineOptions.compiled_layers` (the
        drafters' own passes, whose layers are not the target's `DecoderLayer`s), compiled once per key.
        `alias_inputs`: the inputs are another pass's graph outputs, the same tensors on every call, which
        the graph reads in place."""
        if compile and self.engine.compiled_layers:
            compiled = self.__dict__.setdefault("_compiled_passes", {})
            if key not in compiled:
                compiled[key] = layers.compile_pass(fn, self.engine.compile_backend)
                _ONE_OFF["passes_compiled"] += 1
            fn = compiled[key]
        if self.graphs is not None and key in self.graphs:  # a replay: a `Prefix` fills its first rows only
            return self.graphs[key](*inputs)
        full = [x.padded() if isinstance(x, Prefix) else x for x in inputs]
        if self.graphs is None:
            return fn(*full)
        self.graphs[key] = Graphed(fn, *full, alias=alias_inputs)
        return self.graphs[key](*inputs)
