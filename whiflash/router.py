"""The WhiFlash-Neural router: a 2-layer MLP on the target's final post-norm hidden state.

It predicts the acceptance-length gain ``g = tau(slot 0) - tau(slot 1)`` of a round (tau includes the
bonus token), or a tokens/s form of it (``whiflash.train.speed``); the routed loop drafts with slot 0 when
``g_hat > threshold``. A router may also read a few context features after the hidden state
(:mod:`whiflash.router_context`: entropy, the previous round's slot and tau); one without them is the
upstream contract, hidden state in, one score out. Shared by ``whiflash-train``
(which fits and exports it) and the routed decoding loop (which loads it with :func:`load_router`);
docs/design.md, "Routing".

On disk a router is either a Hub-style folder (``config.json`` + ``model.safetensors`` [+ ``README.md``]),
the same folder on the Hub, or one ``.safetensors`` file whose metadata key ``whiflash_router_config``
holds the JSON config. A router exported by other code (any 2-layer MLP in safetensors, a config
optional) is read by :mod:`whiflash.router_layouts`. Weights are always safetensors and always loaded
strictly: every tensor finds its place.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import PyTorchModelHubMixin, hf_hub_download
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from whiflash.hub import local_or_hub
from whiflash.io import atomic_path, atomic_write_json
from whiflash.pairs import Pair
from whiflash.router_context import check_context
from whiflash.router_layouts import ACTIVATIONS, hints_from, metadata_config, router_from_state
from whiflash.runtime.weights import read_json, read_safetensors, readable_safetensors

log = logging.getLogger(__name__)

CONFIG_METADATA_KEY = "whiflash_router_config"
TRAINING_PROMPTS = "training_prompts.json"
"""Beside an export of whiflash-train: the ids of the prompts whose rows the router was fitted on."""

_ACTIVATION = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


class NeuralRouter(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="whiflash",
    tags=["speculative-decoding", "router", "whiflash"],
):
    """2-layer MLP ``Linear(H + C, mlp_dim) -> GELU -> Dropout -> Linear(mlp_dim, 1)`` over standardised input
    (``activation`` names another of ``ACTIVATIONS``, for routers exported by other code); ``C`` context
    features follow the hidden state when ``context`` names them (none by default).

    Args:
        hidden_size: width H of the target's final hidden state.
        mlp_dim: width of the hidden layer.
        dropout: dropout after the activation (training only).
        drafters: the drafter pair the gain refers to: ``df-e3``, ``ddt-e3`` or ``df-ddt`` (slot 0 first).
            The name is the published config key; in Python the router exposes it as :attr:`pair`.
        tree_budget: DDTree node budget the data was generated with (pairs with a DDTree slot only).
        target: name of the target model the features come from.
        tap_layers: record of the feature layers logged with the data (the router reads the final
            post-norm hidden state only).
        threshold: recommended decision threshold theta (choose slot 0 when ``g_hat > theta``).
        activation: the hidden layer's activation, ``gelu`` (this toolkit's), ``relu``, ``silu`` or ``tanh``.
        context: context features read after the hidden state, by name
            (:data:`whiflash.router_context.CONTEXT_FEATURES`), in this order.
        history: how many committed positions before the decision point the router also reads the final hidden
            state of (0: the decision point's alone, the upstream contract). The input is then
            ``[h[n], h[n-1], ..., h[n-history]]`` (``H * (1 + history)`` wide), then the context features;
            positions before the sequence's first decision point repeat that point's state.
    """

    def __init__(
        self,
        hidden_size: int,
        mlp_dim: int = 1024,
        dropout: float = 0.0,
        drafters: str = "df-e3",
        tree_budget: int | None = None,
        target: str = "",
        tap_layers: list[int] | None = None,
        threshold: float = 0.0,
        activation: str = "gelu",
        context: list[str] | None = None,
        history: int = 0,
    ) -> None:
        super().__init__()
        if hidden_size < 1 or mlp_dim < 1:
            raise ValueError(f"hidden_size and mlp_dim must be positive, got {hidden_size} and {mlp_dim}")
        if not (isinstance(history, int) and not isinstance(history, bool) and history >= 0):
            raise ValueError(f"router config field 'history': expected an integer >= 0, got {history!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"router config field 'activation': expected one of {', '.join(ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.activation = activation
        self.hidden_size, self.mlp_dim, self.dropout = int(hidden_size), int(mlp_dim), float(dropout)
        self.pair: Pair = Pair.parse(drafters, what="router config field 'drafters'")
        self.tree_budget, self.target = tree_budget, target
        self.tap_layers = list(tap_layers) if tap_layers is not None else None
        self.threshold = float(threshold)
        self.context = check_context(context, "router config field 'context'")
        self.history = history
        width = self.input_hidden + len(self.context)
        # Standardisation statistics of the training split; buffers, so they travel in model.safetensors.
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("std", torch.ones(width))
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_dim), _ACTIVATION[activation](), nn.Dropout(dropout), nn.Linear(mlp_dim, 1)
        )

    @property
    def input_hidden(self) -> int:
        """Width of the hidden-state part of the input: ``H * (1 + history)``."""
        return self.hidden_size * (1 + self.history)

    def forward(self, hidden: Tensor, context: Tensor | None = None) -> Tensor:
        """Predicted gain for ``hidden`` of shape ``[N, H]`` (returns ``[N]``) or ``[H]`` (returns a scalar), with
        ``context`` ``[N, C]`` (or ``[C]``) when the router reads context features; with ``history`` the hidden
        part is ``[N, H * (1 + history)]``, the decision point's state first."""
        if hidden.shape[-1] != self.input_hidden:
            what = f"hidden size {self.hidden_size}" + (f" x (1 + history {self.history})" if self.history else "")
            raise ValueError(f"router expects {what}, got input of shape {tuple(hidden.shape)}")
        x = hidden.float()  # float32 whatever the input dtype (fp16/bf16 features)
        if self.context:
            if context is None or context.shape[-1] != len(self.context) or context.shape[:-1] != hidden.shape[:-1]:
                got = None if context is None else tuple(context.shape)
                raise ValueError(f"router reads context features {list(self.context)}: expected context of shape "
                                 f"{(*hidden.shape[:-1], len(self.context))}, got {got}")
            x = torch.cat([x, context.float()], -1)
        return self.mlp((x - self.mean) / self.std).squeeze(-1)

    @torch.no_grad()
    def set_normalization(self, mean: Tensor, std: Tensor, eps: float = 1e-6) -> None:
        """Store input mean/std (size H * (1 + history) + C); std is floored at ``eps`` so constant features stay
        finite."""
        width = self.input_hidden + len(self.context)
        if mean.shape != (width,) or std.shape != (width,):
            raise ValueError(f"mean/std must have shape ({width},), got {tuple(mean.shape)}/{tuple(std.shape)}")
        self.mean.copy_(mean.float())
        self.std.copy_(std.float().clamp_min(eps))

    @property
    def drafters(self) -> str:
        """The pair's name, as the config key ``drafters`` stores it."""
        return str(self.pair)

    @drafters.setter
    def drafters(self, value: str | Pair) -> None:
        self.pair = Pair.parse(value, what="router config field 'drafters'")

    def config(self) -> dict[str, Any]:
        """The JSON config (the constructor arguments) as currently set, e.g. after changing ``threshold``."""
        return {
            "hidden_size": self.hidden_size, "mlp_dim": self.mlp_dim, "dropout": self.dropout,
            "drafters": self.drafters, "tree_budget": self.tree_budget, "target": self.target,
            "tap_layers": self.tap_layers, "threshold": self.threshold, "activation": self.activation,
            "context": list(self.context), "history": self.history,
        }


def suggested_repo_name(target: str, pair: str | Pair, tree_budget: int | None) -> str:
    """Upstream naming: ``{target basename}-NeuralRouter-{pair}[-b{budget}]`` (budget only for DDTree pairs)."""
    pair = Pair.parse(pair, what="pair")
    base = target.rstrip("/").split("/")[-1] or "router"
    name = f"{base}-NeuralRouter-{pair}"
    if pair.uses_tree and tree_budget is not None:
        name += f"-b{tree_budget}"
    return name


def export_single_file(router: NeuralRouter, path: str | Path) -> Path:
    """Write weights + config as one ``.safetensors`` file (config JSON in the header metadata)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in router.state_dict().items()}
    meta = {"format": "pt", CONFIG_METADATA_KEY: json.dumps(router.config(), sort_keys=True)}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata=meta)
    return path


def write_training_prompts(folder: str | Path, prompts: list[str], dataset_sha256: str) -> Path:
    """Record in `folder` the prompts a router was fitted on, so a replay can leave their rows out."""
    path = Path(folder) / TRAINING_PROMPTS
    atomic_write_json(path, {"dataset_manifest_sha256": dataset_sha256, "prompts": sorted(prompts)})
    return path


def training_prompts(source: str | Path) -> list[str] | None:
    """The prompt ids the router at `source` was fitted on: `TRAINING_PROMPTS` in its folder, or beside its
    single file; None where there is none (a Hub id, a router trained elsewhere)."""
    src = Path(source)
    path = src / TRAINING_PROMPTS if src.is_dir() else src.parent / TRAINING_PROMPTS
    if not path.is_file():
        return None
    try:
        prompts = json.loads(path.read_text())["prompts"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected {{\"prompts\": [prompt ids]}} as whiflash-train writes it ({e})") from e
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{path}: \"prompts\" should be a list of prompt ids (strings)")
    return prompts


def _build(config: dict[str, Any], weights: str | Path, source: str, config_from: str) -> NeuralRouter:
    """The router ``config`` (read from ``config_from``) describes, with the weights of file ``weights``."""
    try:
        router = NeuralRouter(**config)
    except TypeError as e:
        raise ValueError(f"router {source}: config {config_from} does not match NeuralRouter's arguments: {e} "
                         "(expected the config.json written by whiflash-train fit)") from e
    state = read_safetensors(weights)
    missing = sorted(set(router.state_dict()) - set(state))
    unexpected = sorted(set(state) - set(router.state_dict()))
    if missing or unexpected:
        raise ValueError(f"router {source}: weights {weights} do not match the config "
                         f"(missing keys {missing}, unexpected keys {unexpected})")
    try:
        router.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"router {source}: weights {weights} do not match its config: {e}") from e
    return router.eval()


def _read_config(path: Path, source: str) -> dict[str, Any]:
    """The router config at ``path``; errors name ``path`` and what the file should be."""
    if not path.is_file():
        raise FileNotFoundError(f"router {source}: expected {path.name} (the router config) at {path}")
    return read_json(path, "a router config (a JSON object of NeuralRouter's arguments)")


def _ours(config: dict[str, Any] | None, weights: str | Path) -> bool:
    """Whether ``config`` and the tensors of ``weights`` are this toolkit's export (read strictly by ``_build``):
    a config with NeuralRouter's own field names and weights under its ``mlp.0`` keys."""
    if not config or not ({"drafters", "mlp_dim"} & set(config)):
        return False
    with readable_safetensors(weights), safe_open(str(weights), framework="pt") as f:
        return "mlp.0.weight" in set(f.keys())


def _folder_weights(folder: Path, source: str, has_config: bool) -> Path:
    """``model.safetensors`` of a router folder, else its one ``.safetensors`` file."""
    if (folder / "model.safetensors").is_file():
        return folder / "model.safetensors"
    found = sorted(folder.glob("*.safetensors"))
    if len(found) == 1:
        return found[0]
    what = "config.json + model.safetensors" if not has_config else "model.safetensors (the router weights)"
    raise FileNotFoundError(f"router {source}: expected {what} at {folder / 'model.safetensors'}, or one exported "
                            f".safetensors file in {folder}; found {[p.name for p in found] or 'none'}")


def _hub_files(repo: str, source: str, revision: str | None) -> tuple[dict[str, Any] | None, str]:
    """(config or None, weights file) of a Hub router repo: config.json when it has one, and model.safetensors or
    else its one .safetensors file; safetensors only, never a pickle fallback."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        try:
            config: dict[str, Any] | None = _read_config(Path(hf_hub_download(repo, "config.json", revision=revision)),
                                                         source)
        except RemoteEntryNotFoundError:  # a repo of weights only: dimensions come from the tensors
            config = None
        try:
            weights = hf_hub_download(repo, "model.safetensors", revision=revision)
        except RemoteEntryNotFoundError:
            files = [f for f in HfApi().list_repo_files(repo, revision=revision) if f.endswith(".safetensors")]
            if len(files) != 1:
                raise FileNotFoundError(f"expected model.safetensors or one .safetensors file, found {files}") from None
            weights = hf_hub_download(repo, files[0], revision=revision)
    except Exception as e:  # offline, unknown repo, missing file: say what was tried
        raise FileNotFoundError(f"router {source}: not a local folder or file, and downloading config.json + "
                                f"model.safetensors from the Hub repo '{source}' failed: {e}") from e
    return config, weights


def load_router(
    name_or_path: str | Path,
    *,
    hidden_size: int | None = None,
    pair: str | Pair | None = None,
    tree_budget: int | None = None,
    device: str | torch.device = "cpu",
    revision: str | None = None,
) -> NeuralRouter:
    """Load a router from a Hub repo id, a local folder or a single ``.safetensors`` file, strictly.

    This toolkit's export (``config.json`` + ``model.safetensors``, or one file with the config in its
    metadata) is rebuilt from its config; any other 2-layer MLP in safetensors (a folder or repo with or
    without a config, a file without the metadata) is read by :func:`whiflash.router_layouts.router_from_state`,
    its dimensions from its tensors. ``hidden_size``, ``pair`` and ``tree_budget`` describe the run that will
    use the router; when given they must agree with what the router was trained for, otherwise a
    ``ValueError`` names both. A name that is neither an existing path nor a Hub repo id fails at once
    (:func:`whiflash.hub.local_or_hub`).
    """
    src = str(name_or_path)
    found = local_or_hub(name_or_path, "router")
    config: dict[str, Any] | None
    if isinstance(found, str):
        config, weights = _hub_files(found, src, revision)
        config_from = f"config.json of {src}"
    elif found.is_dir():
        config_path = found / "config.json"
        config = _read_config(config_path, src) if config_path.is_file() else None
        weights, config_from = _folder_weights(found, src, config is not None), str(config_path)
    else:
        if found.suffix != ".safetensors":
            raise ValueError(f"router {src}: expected a folder or a .safetensors file, got {found.suffix or 'no suffix'}")
        with readable_safetensors(found), safe_open(str(found), framework="pt") as f:
            meta = f.metadata() or {}
        config = json.loads(meta[CONFIG_METADATA_KEY]) if CONFIG_METADATA_KEY in meta else metadata_config(meta)
        weights, config_from = found, f"'{CONFIG_METADATA_KEY}' of {found}"
    if _ours(config, weights):
        router = _build(config or {}, weights, src, config_from)
    else:
        router = router_from_state(read_safetensors(weights), hints_from(config, src), src, NeuralRouter, pair)
    check_compatible(router, src, hidden_size, pair, tree_budget)
    return router.to(device)


def check_compatible(router: NeuralRouter, src: str, hidden_size: int | None,
                     pair: str | Pair | None, tree_budget: int | None) -> None:
    """Raise ``ValueError`` naming both sides when a run's hidden size, pair or tree budget differs from the
    router's; ``None`` means "not known", which is not checked."""
    def desc(p: Pair, budget: int | None) -> str:
        return f"'{p}'" + (f" with tree budget {budget}" if p.uses_tree and budget is not None else "")

    if hidden_size is not None and hidden_size != router.hidden_size:
        raise ValueError(f"router {src} was trained on hidden size {router.hidden_size} (target "
                         f"'{router.target}'), but this run's target has hidden size {hidden_size}")
    run_pair = Pair.parse(pair, what="pair") if pair is not None else router.pair
    budget_bad = (tree_budget is not None and router.tree_budget is not None and router.pair.uses_tree
                  and tree_budget != router.tree_budget)
    if run_pair != router.pair or budget_bad:
        raise ValueError(f"router {src} was trained for pair {desc(router.pair, router.tree_budget)}, "
                         f"but this run uses {desc(run_pair, tree_budget)}; use a router trained for this pair "
                         "and budget (see suggested_repo_name) or change --whiflash-drafters/--ddtree-tree-budget")
    if router.pair.uses_tree and tree_budget is not None and router.tree_budget is None:
        log.warning("router %s does not record its DDTree tree budget; this run uses %d", src, tree_budget)
