"""Building blocks shared by the target runtime and the drafters: RMSNorm, SwiGLU, RoPE, attention."""
from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from whiflash.runtime import decode_attention, gemv
from whiflash.runtime.cache import KVCache, Rows, write_slots
from whiflash.runtime.options import EngineOptions

log = logging.getLogger(__name__)

VARYING_SHAPE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA kernels for passes whose shapes change from call to call (eager decoding, prefill).

cuDNN attention builds an execution plan for every new shape: on the H200, eager decoding at the
small testbed's shapes (a new key length every step) took 53-88 ms per token with it and 6 ms
without. Fixed-shape passes (CUDA graphs) keep PyTorch's choice: their one plan is built once."""


@dataclass(frozen=True, eq=False)
class Kernels:
    """What a layer module runs under its model's `EngineOptions` (`kernels_for`): one shared, read-only
    object, an attribute of every module that asks (dynamo reads it as a constant of the module)."""

    attention: bool
    """Fixed-shape passes attend through `decode_attention` where it is usable."""
    gemv: gemv.Table | None
    """The GEMV kernel's settings table; None: every product through cuBLAS."""
    stages: tuple[Callable[..., Any], Callable[..., Any]] | None
    """`DecoderLayer`'s compiled `pre`/`post` stages of fixed-shape passes; None: uncompiled."""


@lru_cache(maxsize=None)
def kernels_for(options: EngineOptions) -> Kernels:
    """The `Kernels` of `options` (one object per distinct options, so compiled stages are made once)."""
    stages = None
    if options.compiled_layers:
        check_compilable(options.compile_backend)
        stages = (compile_pass(_pre, options.compile_backend), compile_pass(_post, options.compile_backend))
    return Kernels(options.attention_kernel, gemv.table_for(options), stages)


def use_kernels(module: nn.Module, options: EngineOptions) -> None:
    """Give every layer module inside `module` the `Kernels` of `options`."""
    kernels = kernels_for(options)
    for m in module.modules():
        if isinstance(m, (SwiGLU, Attention, DecoderLayer)):
            m.kernels = kernels


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as transformers does, then cast back."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # one fused kernel for the normalisation (the composite form is 6 launches per call, and a
        # decode step makes ~150 of these calls)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def stacked(module: nn.Module, fused: str, parts: dict[str, int]) -> None:
    """Store the Linear layers `parts` (checkpoint name -> output rows), which read the same input, as one
    Linear `fused` with their rows stacked: a pass then runs one GEMM instead of several (a decode step
    is launch- and bandwidth-bound). Checkpoints keep the separate names: loading stacks the
    `<prefix><name>.weight` (and `.bias`) tensors, and `state_dict` hands back row views of the stacked
    weight under those names, so copying into them (`load_strict`) fills it."""
    names, sizes = list(parts), list(parts.values())

    def split(mod: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
        for leaf in ("weight", "bias"):
            key = f"{prefix}{fused}.{leaf}"
            if key in state:
                for name, piece in zip(names, state.pop(key).split(sizes)):
                    state[f"{prefix}{name}.{leaf}"] = piece

    def join(mod: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        for leaf in ("weight", "bias"):
            keys = [f"{prefix}{name}.{leaf}" for name in names]
            if all(k in state for k in keys):
                state[f"{prefix}{fused}.{leaf}"] = torch.cat([state.pop(k) for k in keys])

    module.register_state_dict_post_hook(split)
    module.register_load_state_dict_pre_hook(join)


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`; gate and up are one stacked Linear (`gate_up`) saved as HF's
    `gate_proj`/`up_proj`."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.hidden = hidden
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        stacked(self, "gate_up", {"gate_proj": hidden, "up_proj": hidden})
        self.kernels = kernels_for(EngineOptions())

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """The MLP of `x`, plus `residual` when given (added inside the down projection's kernel on the GPU)."""
        table = self.kernels.gemv
        gate, up = gemv.linear(x, self.gate_up, table=table).split(self.hidden, dim=-1)
        return gemv.linear(F.silu(gate) * up, self.down_proj, residual, table)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> Tensor:
    """Inverse frequencies of rotary embeddings, with Llama-3.1 (`llama3`) or linear scaling."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").double() / head_dim))
    if not scaling:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float()
    # llama3: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled).float()


class Rotary:
    """cos/sin tables over absolute positions, kept in float32 whatever the model dtype.

    A plain object rather than a module, so that casting a model to bf16 never casts the tables
    (transformers also keeps its rotary frequencies in float32).
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> None:
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.cos = self.sin = None  # built by `ensure` once the device and cache length are known
        self._cast: dict[torch.dtype, Tensor] = {}

    def ensure(self, n: int, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
        """Make the tables cover positions `< n` on `device` (called when a cache is sized), and build the
        `dtype` table now rather than inside a compiled pass (whose guards would see it appear and recompile)."""
        device = torch.device(device)
        if self.cos is None or n > self.cos.shape[0] or self.cos.device != device:
            n = max(n, self.cos.shape[0]) if self.cos is not None else n
            cpu = torch.device("cpu")  # also correct when called under a `torch.device("meta")` context
            inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(cpu)
            freqs = torch.outer(torch.arange(n, dtype=torch.float32, device=cpu), inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self.cos, self.sin = emb.cos().to(device), emb.sin().to(device)
            self._cast = {}
        if dtype is not None:
            self.table(dtype)

    def table(self, dtype: torch.dtype) -> Tensor:
        """`[n, 2, head_dim]`: cos and sign-folded sin rounded to `dtype` (as transformers rounds them).

        The sin half that multiplies the negated half of rotate-half carries the minus sign, so the
        rotation is `x * cos + roll(x, half) * sin'`: no negation and no concatenation per call.
        """
        if dtype not in self._cast:
            half = self.head_dim // 2
            sin = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)
            self._cast[dtype] = torch.stack([self.cos, sin], dim=1).to(dtype)
        return self._cast[dtype]

    def angles(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """`[T, 2, head_dim]` rows of `table(dtype)` at `positions`: one gather per pass, shared by every layer."""
        return self.table(dtype)[positions]

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate `x [..., T, head_dim]` by the angles of `positions [T]` (HF rotate-half convention)."""
        return rotate(x, self.angles(positions, x.dtype))


def rotate(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate `x [..., T, head_dim]` by `angles [T, 2, head_dim]` (`Rotary.angles`)."""
    return x * angles[:, 0] + x.roll(x.shape[-1] // 2, dims=-1) * angles[:, 1]


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, fixed_shape: bool = False,
              kernel: bool = False) -> Tensor:
    """Grouped-query attention of `q [Hq, T, D]` over `k, v [Hkv, S, D]` -> `[Hq, T, D]`.

    `mask [T, S]` is boolean (True: may attend), or None when every query sees every key. Query
    heads sharing a K/V head (transformers' `repeat_kv` grouping: head `h` reads K/V head
    `h // (Hq / Hkv)`) are folded into the query length, so K/V are never expanded and one fused
    SDPA kernel (flash, cuDNN or memory-efficient, as PyTorch picks) serves every shape;
    `fixed_shape=False` (a shape this call may never see again) leaves cuDNN out. Fixed-shape passes
    of short query blocks on the GPU run `decode_attention` instead (`kernel`: the module's
    `Kernels.attention`), which reads only the cache tiles the mask shows.
    """
    if fixed_shape and kernel and decode_attention.usable(q, k, mask):
        return decode_attention.masked_attention(q, k, v, mask)
    hq, t, d = q.shape
    group = hq // k.shape[0]
    q = q.reshape(k.shape[0], group * t, d)
    if mask is not None and group > 1:
        mask = mask.repeat(group, 1)
    if fixed_shape:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)
    else:
        with sdpa_kernel(VARYING_SHAPE_BACKENDS):
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)
    return out[0].reshape(hq, t, d)  # fused kernels return a head-strided layout: not viewable


class Attention(nn.Module):
    """Grouped-query self-attention over a static `KVCache`, with transformers' parameter names.

    One module serves the target (Qwen3 / Llama), DFlash's layers (always Q/K norms; the block
    attends to the cached context and to itself) and EAGLE-3's mid layer (`dim_in = 2H`, no Q/K
    norms): their maths is the same. `kv` alone is what a K/V-only catch-up needs. Q, K and V are one
    stacked Linear (`qkv`, saved as `q_proj`/`k_proj`/`v_proj`): a full pass runs one GEMM for the three,
    a catch-up one for K and V.
    """

    def __init__(self, dim_in: int, dim_out: int, n_heads: int, n_kv: int, head_dim: int, bias: bool = False,
                 qk_norm: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = n_heads, n_kv, head_dim
        self.sizes = [n_heads * head_dim, n_kv * head_dim, n_kv * head_dim]
        self.qkv = nn.Linear(dim_in, sum(self.sizes), bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, dim_out, bias=bias)
        stacked(self, "qkv", dict(zip(("q_proj", "k_proj", "v_proj"), self.sizes)))
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        self.kernels = kernels_for(EngineOptions())

    def _project(self, x: Tensor, start: int, end: int) -> Tensor:
        """Rows `start:end` of the stacked projection of `x` (one GEMM over that slice of the weight)."""
        bias = self.qkv.bias[start:end] if self.qkv.bias is not None else None
        return gemv.product(x, self.qkv.weight[start:end], bias, table=self.kernels.gemv)

    def q(self, x: Tensor) -> Tensor:
        """Query projection `[..., n_heads * head_dim]` (before norm and rotation)."""
        return self._project(x, 0, self.sizes[0])

    def k(self, x: Tensor) -> Tensor:
        """Key projection `[..., n_kv * head_dim]` (before norm and rotation)."""
        return self._project(x, self.sizes[0], self.sizes[0] + self.sizes[1])

    def v(self, x: Tensor) -> Tensor:
        """Value projection `[..., n_kv * head_dim]`."""
        return self._project(x, self.sizes[0] + self.sizes[1], sum(self.sizes))

    def _keys_values(self, k: Tensor, v: Tensor, angles: Tensor) -> tuple[Tensor, Tensor]:
        t = k.shape[0]
        k = k.view(t, self.nkv, self.hd)
        if self.qk_norm:
            k = self.k_norm(k)
        return rotate(k.transpose(0, 1), angles), v.view(t, self.nkv, self.hd).transpose(0, 1)

    def _queries(self, q: Tensor, angles: Tensor) -> Tensor:
        q = q.view(q.shape[0], self.nh, self.hd)
        if self.qk_norm:
            q = self.q_norm(q)
        return rotate(q.transpose(0, 1), angles)

    def output(self, attn: Tensor, residual: Tensor | None = None) -> Tensor:
        """`o_proj` of an attention result `[n_heads, T, head_dim]` -> `[T, dim_out]` (plus `residual`)."""
        return gemv.linear(attn.transpose(0, 1).reshape(attn.shape[1], -1), self.o_proj, residual, self.kernels.gemv)

    def project(self, x: Tensor, angles: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q `[n_heads, T, hd]`, K and V `[n_kv, T, hd]` of rows `x` (normed and rotated by `angles`)."""
        q, k, v = gemv.linear(x, self.qkv, table=self.kernels.gemv).split(self.sizes, dim=-1)
        return self._queries(q, angles), *self._keys_values(k, v, angles)

    def kv(self, x: Tensor, rope: Rotary, positions: Tensor) -> tuple[Tensor, Tensor]:
        """K (normed, rotated) and V of rows `x [T, dim_in]`, each `[n_kv, T, head_dim]`."""
        k, v = self._project(x, self.sizes[0], sum(self.sizes)).split(self.sizes[1:], dim=-1)
        return self._keys_values(k, v, rope.angles(positions, x.dtype))

    def attend(self, x: Tensor, rope: Rotary, positions: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None,
               fixed_shape: bool, residual: Tensor | None = None) -> Tensor:
        """Queries of rows `x` against `keys, values [n_kv, S, head_dim]` (mask `[T, S]` or None: all visible),
        through `o_proj` (plus `residual`)."""
        q = self._queries(self.q(x), rope.angles(positions, x.dtype))
        return self.output(attention(q, keys, values, mask, fixed_shape, self.kernels.attention), residual)


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer (Qwen3 / Llama; also every DFlash draft layer): attention, then SwiGLU.

    A pass is `pre` (norm, Q/K/V, rotation), the cache write and attention, then `post` (output
    projection, residuals, MLP). With `EngineOptions.compiled_layers` (`Kernels.stages`) fixed-shape passes
    run `pre` with the cache write (the layer's cache tensors are arguments) and `post` through
    torch.compile, once per row count and cache size for every layer.
    """

    def __init__(self, hidden: int, intermediate: int, n_heads: int, n_kv: int, head_dim: int, eps: float = 1e-6,
                 attention_bias: bool = False, qk_norm: bool = False, mlp_bias: bool = False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, hidden, n_heads, n_kv, head_dim, attention_bias, qk_norm, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(hidden, intermediate, mlp_bias)
        self.kernels = kernels_for(EngineOptions())

    def pre(self, x: Tensor, angles: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V of the residual stream `x [T, hidden]` (`Attention.project` of its norm)."""
        return self.self_attn.project(self.input_layernorm(x), angles)

    def post(self, x: Tensor, attn: Tensor) -> Tensor:
        """The layer's output from its input `x` and its attention result `attn [n_heads, T, hd]`."""
        x = self.self_attn.output(attn, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)

    def forward(self, x: Tensor, angles: Tensor, cache: KVCache, index: int, rows: Rows,
                mask: Tensor | None) -> Tensor:
        """Rows `x [T, hidden]` rotated by `angles` (`Rotary.angles`) write their K/V into `cache` layer
        `index` at `rows`, attend under `mask`, and come out of the layer."""
        if not rows.fixed:
            q, k, v = self.pre(x, angles)
            keys, values = cache.write(index, k, v, rows)
            return self.post(x, attention(q, keys, values, mask, False))
        pre, post = self.kernels.stages or (_pre, _post)
        keys, values = cache.k[index], cache.v[index]
        q = pre(self, x, angles, keys, values, rows.slots)
        return post(self, x, attention(q, keys, values, mask, True, self.kernels.attention))


def _pre(layer: DecoderLayer, x: Tensor, angles: Tensor, keys: Tensor, values: Tensor, slots: Tensor) -> Tensor:
    """A fixed-shape pass's `pre` stage and cache write: the queries of `x`, its K/V stored at `slots` of the
    layer's `keys, values` (compiled, the write is fused into the kernels that compute K and V)."""
    q, k, v = layer.pre(x, angles)
    write_slots(keys, values, k, v, slots)
    return q


def _post(layer: DecoderLayer, x: Tensor, attn: Tensor) -> Tensor:
    return layer.post(x, attn)


def check_compilable(backend: str = "inductor") -> None:
    """Refuse compiled layers where torch.compile cannot run them (and allow enough recompiles for a run).

    Compiled stages are made once per row count and cache size, whatever the layer: the layer is an
    argument, whose parameters dynamo treats as inputs, and so are the layer's cache tensors (views of
    one cache differ only in their storage offset, which is not guarded; inductor writes them in
    place). Caches are sized once per run (they only grow, and the eval sizes them for its longest
    sample first), so a run's variants are its few widths (decode step, verify, tree, drafter block)
    times its two caches (target, DFlash). `dynamic=False` keeps every shape static, and the recompile
    limit is raised to `RECOMPILE_LIMIT` so that none falls back to eager. Compilation happens on a
    pass's first call, which CUDA graph capture runs as a warm-up before capturing.
    """
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        raise RuntimeError("--compile-layers: torch.compile does not run on this Python/torch "
                           f"(Python {sys.version.split()[0]}, torch {torch.__version__}); run without it")
    if backend == "inductor" and torch.cuda.is_available() and decode_attention.triton is None:
        raise RuntimeError("--compile-layers: torch.compile's GPU code needs Triton, which is not installed "
                           "(pip install -e \".[gpu]\"); run without it")
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, RECOMPILE_LIMIT)


def compile_pass(fn: Callable[..., Any], backend: str = "inductor") -> Callable[..., Any]:
    """`fn` through torch.compile (`dynamic=False`, one graph): the layer stages, and a drafter's whole
    fixed-shape pass (`FixedShapePasses.run_fixed(..., compile=True)`: its one layer or K/V projections,
    norms, rotations, cache writes and head glue fused like the target's stages). Should compiling fail
    (an op dynamo cannot trace on this torch, the recompile limit), `fn` warns once and runs uncompiled
    from then on: the option is an optimisation only."""
    compiled = torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)

    def run(*args: Any) -> Any:
        nonlocal compiled
        if compiled is not fn:
            try:
                return compiled(*args)
            except Exception as exc:  # noqa: BLE001 - report and fall back; a real error recurs uncompiled
                log.warning("torch.compile failed on %s (%s: %s); it runs uncompiled",
                            getattr(fn, "__qualname__", fn), type(exc).__name__, str(exc)[:300])
                compiled = fn
        return fn(*args)

    return run


RECOMPILE_LIMIT = 256
"""Compiled variants allowed per stage: one per pass row count and cache size (and dtype) a process uses. A run
needs about ten; past the limit a `fullgraph` compile fails, so it is set well above (the GPU test file, a
dozen worlds in one process, reached 64 before it reset dynamo between tests)."""
