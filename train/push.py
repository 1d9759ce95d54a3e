"""``whiflash-train push``: upload an exported router folder to the Hugging Face Hub."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from whiflash.errors import UsageError
from whiflash.router import load_router, suggested_repo_name

log = logging.getLogger(__name__)

REQUIRED_FILES = ("config.json", "model.safetensors", "README.md")


class HubPushError(RuntimeError):
    """The Hub refused or could not be reached; the message names the repo and what to do."""


def _is_hub_error(e: Exception) -> bool:
    """Whether ``e`` comes from the Hub or the way to it: hub errors (HTTP, no token, offline mode) are
    ``HfHubHTTPError`` or ``OSError``; the HTTP client's own (httpx, requests) come from its module."""
    return isinstance(e, (HfHubHTTPError, OSError)) or type(e).__module__.split(".")[0] in ("httpx", "requests")


@contextmanager
def hub_errors(repo: str) -> Iterator[None]:
    """Turn the hub library's errors (no token, offline, HTTP 401/403/404, no network) into :class:`HubPushError`."""
    try:
        yield
    except Exception as e:
        if not _is_hub_error(e):
            raise
        raise HubPushError(
            f"whiflash-train push: could not push to the Hub repo {repo} ({type(e).__name__}: {e}). "
            "Log in with `huggingface-cli login` (or `hf auth login`) or set HF_TOKEN to a token that may write "
            f"to {repo}, and make sure the Hub is reachable (unset HF_HUB_OFFLINE)") from e


def check_repo_id(repo_id: str) -> None:
    """Refuse a ``--repo-id`` the Hub would not take, before anything is loaded or sent."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UsageError(f"--repo-id {repo_id!r}: not a Hub repo id ({e}); expected ORG/NAME, e.g. "
                         "alice/Qwen3-8B-NeuralRouter-df-e3") from None


def push(
    router: Path,
    repo_id: str | None = None,
    namespace: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
) -> str:
    """Push an exported router folder (``RUN/router``) to the Hub in one commit.

    The folder is loaded strictly first, so a broken export is never uploaded.

    Args:
        router: exported router folder (config.json, model.safetensors, README.md).
        repo_id: target repository ``ORG/NAME``. When unset, the upstream name
            ``{target}-NeuralRouter-{pair}[-b{budget}]`` is used under ``namespace``.
        namespace: user or organisation for the suggested name (default: the token's user).
        private: create the repository as private (only when it does not exist yet).
        revision: branch to push to (created from main when missing); default main.
        commit_message: commit message (default names the drafter pair and threshold).
        token: Hub token (default: the cached login / HF_TOKEN).

    Returns:
        The URL of the commit.
    """
    return push_router(router, repo_id, namespace=namespace, private=private, revision=revision,
                       commit_message=commit_message, token=token)


def push_router(router: str | Path, repo_id: str | None = None, *, namespace: str | None = None,
                private: bool = False, revision: str | None = None, commit_message: str | None = None,
                token: str | None = None, api: HfApi | None = None) -> str:
    """Library form of :func:`push` with an injectable ``api`` (tests pass a fake)."""
    if repo_id is not None:
        check_repo_id(repo_id)
    folder = Path(router)
    missing = [f for f in REQUIRED_FILES if not (folder / f).is_file()]
    if not folder.is_dir() or missing:
        raise FileNotFoundError(f"router folder {folder}: expected {list(REQUIRED_FILES)} "
                                f"(an export of whiflash-train fit), missing {missing if folder.is_dir() else 'the folder'}")
    model = load_router(folder)  # strict: never push weights that do not match their config
    suggested = suggested_repo_name(model.target, model.pair, model.tree_budget)
    api = api or HfApi(token=token)
    if repo_id is None:
        with hub_errors(f"<your namespace>/{suggested} (no --repo_id given)"):
            namespace = namespace or api.whoami()["name"]
        repo_id = f"{namespace}/{suggested}"
        log.info("no --repo_id given; using the upstream name %s", repo_id)
    elif repo_id.split("/")[-1] != suggested:
        log.info("repo %s does not follow the upstream naming (suggested: %s)", repo_id, suggested)
    message = commit_message or (f"Upload WhiFlash-Neural router ({model.pair}"
                                 + (f", tree budget {model.tree_budget}" if model.pair.uses_tree and model.tree_budget else "")
                                 + f", threshold {model.threshold:g})")
    with hub_errors(repo_id):
        repo_id = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True).repo_id
        if revision and revision != "main":
            api.create_branch(repo_id=repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder), commit_message=message,
                                 revision=revision, allow_patterns=list(REQUIRED_FILES))
    url = getattr(info, "commit_url", None) or str(info)
    log.info("pushed %s to %s (%s)", folder, repo_id, url)
    return url
