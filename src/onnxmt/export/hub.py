"""Resolving a model argument (local directory or hub id) to a local directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# What an export needs from a hub repository; skips other frameworks' weights (tf_model.h5, flax, rust).
HUB_PATTERNS = ["*.json", "*.spm", "*.model", "*.safetensors", "pytorch_model.bin", "*.txt"]


class ModelNotFoundError(ValueError):
    pass


def resolve_model(model: str, revision: str | None = None) -> tuple[Path, str | None]:
    """A local directory as it is, or a hub id downloaded through huggingface_hub (HF_ENDPOINT, HF_TOKEN and
    HF_HUB_OFFLINE are honoured). Returns the directory and the resolved revision (None for a local directory)."""
    local = Path(model).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelNotFoundError(f"{local} is a file; give a model directory or a hub id")
        if not (local / "config.json").is_file():
            raise ModelNotFoundError(f"{local} has no config.json: is it a HuggingFace model directory?")
        return local, None
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ModelNotFoundError(f"model directory not found: {model}")
    return _download(model, revision)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def _download(repo_id: str, revision: str | None) -> tuple[Path, str | None]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        path = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    except RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"unknown model id {repo_id!r} on {endpoint} (or it is private: set HF_TOKEN)") from e
    except RevisionNotFoundError as e:
        raise ModelNotFoundError(f"{repo_id!r} has no revision {revision!r}") from e
    except GatedRepoError as e:
        raise ModelNotFoundError(f"{repo_id!r} is gated: accept its licence on the hub and set HF_TOKEN") from e
    except (LocalEntryNotFoundError, OSError) as e:
        if _offline():
            why = f"HF_HUB_OFFLINE is set and {repo_id!r} is not in the hub's cache"
        else:
            why = f"cannot download {repo_id!r}: the hub at {endpoint} is unreachable ({e.__class__.__name__})"
        raise ModelNotFoundError(
            f"{why}. Use a local model directory (onnxmt export ./path/to/model OUT), a mirror (HF_ENDPOINT=...), "
            "or try onnxmt on a tiny random model first (README, 'Without the hub')."
        ) from e
    return Path(path), Path(path).name


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No weight-loading progress bar, and no notice that max_new_tokens overrides the config's max_length."""
    try:
        from transformers.utils import logging
    except ImportError:  # what needs transformers inside says which extra installs it
        yield
        return
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
