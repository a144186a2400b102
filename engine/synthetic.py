"""A cheap, correlated draft/target pair for speculative-decoding speed tests, built locally from random weights.

The target is a random Llama with SmolLM2-135M's shapes (so it costs what a real small model costs) whose
layers after the first ``draft_layers`` are damped: their output projections (``o_proj``, ``down_proj``)
are scaled by ``damping``, so the deep layers only nudge the residual stream. The draft is the target's
first ``draft_layers`` layers plus the very same embedding, final norm and (tied) head, so the two agree
on most greedy tokens without any training. Both are Hugging Face-layout fp32 safetensors directories
with the real SmolLM2 tokenizer and ChatML template (copied from the converted default model).

This module owns building the pair (deterministically from a seed, into a temporary directory renamed
into place under a file lock, like ``engine.smollm2``); ``engine.pair_measures`` measures how often the two agree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine import smollm2
from engine.errors import InvalidParameterError

if TYPE_CHECKING:  # torch imports where a pair is built or measured: the registry lists the aliases without it
    import torch

logger = logging.getLogger(__name__)

TARGET_ALIAS = "synthetic-target"
DRAFT_ALIAS = "synthetic-draft"
ALIASES = (TARGET_ALIAS, DRAFT_ALIAS)
PAIR_NAME = "synthetic-pair"
MARKER_NAME = ".ssd-chat-synthetic.json"  # written last: the pair is complete, and built with these settings
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
BOS_ID, EOS_ID, PAD_ID = 1, 2, 2  # <|im_start|>, <|im_end|> (end of a chat turn), <|im_end|>
DEFAULT_DRAFT_LAYERS = 4
DEFAULT_DAMPING = 0.05  # with 4 draft layers: greedy agreement about 0.75 (see greedy_agreement)
# Init: projections std 1/sqrt(fan_in), norms 1, except the final norm (random signs, see target_state_dict).
# The library's std 0.02 gives flat logits; a std-1 tied embedding makes logits ~ N(0, hidden): decisive.
EMBED_STD = 1.0
# The target's head scores every token but can only emit the first DEFAULT_HEAD_VOCAB ids (the others' head
# rows are zero, and the largest of thousands of N(0, hidden) logits is far above 0), so the draft's head
# keeps just those rows ("reduced_head"): 8192 x 576 instead of 49152 x 576, a sixth of the cost.
DEFAULT_HEAD_VOCAB = 8192


@dataclass(frozen=True)
class PairShape:
    """The target's shapes; the defaults are SmolLM2-135M's. The vocabulary is the tokenizer's."""

    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    max_position_embeddings: int = 8192
    rope_theta: float = 100000.0

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.intermediate_size, self.num_layers, self.num_heads, self.head_dim) < 1:
            raise InvalidParameterError(f"every size in {self} must be positive")
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise InvalidParameterError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads")


@dataclass(frozen=True)
class PairSettings:
    """Everything the pair's bytes depend on (besides the tokenizer): recorded in the marker file."""

    seed: int = 0
    draft_layers: int = DEFAULT_DRAFT_LAYERS
    damping: float = DEFAULT_DAMPING
    shape: PairShape = field(default_factory=PairShape)
    head_vocab: int = DEFAULT_HEAD_VOCAB  # tokens the target can emit (ids below this); 0: all, with a tied head

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**64:  # (torch's generator takes no other seed)
            raise InvalidParameterError(f"seed takes a whole number from 0 to 2^64-1; got {self.seed}")
        if not 1 <= self.draft_layers < self.shape.num_layers:
            raise InvalidParameterError(
                f"draft_layers takes 1 to {self.shape.num_layers - 1} (the target has {self.shape.num_layers} "
                f"layers); got {self.draft_layers}"
            )
        if self.head_vocab < 0:
            raise InvalidParameterError(f"head_vocab takes at least 0 (0: all); got {self.head_vocab}")
        if not 0.0 <= self.damping <= 1.0:
            raise InvalidParameterError(f"damping takes a number from 0 to 1; got {self.damping:g}")


def default_pair_dir() -> Path:
    """Where the aliases' pair lives: ``<cache>/models/synthetic-pair`` (it may not exist yet)."""
    return smollm2.cache_root() / "models" / PAIR_NAME


def is_built(pair_dir: Path, settings: PairSettings | None = None) -> bool:
    """True when ``pair_dir`` holds a complete pair (built with ``settings``, if given)."""
    marker = pair_dir / MARKER_NAME
    if not marker.is_file():
        return False
    return settings is None or json.loads(marker.read_text()) == asdict(settings)


def is_available() -> bool:
    """True when the aliases resolve without network: the pair is built, or its tokenizer's source is here."""
    return is_built(default_pair_dir()) or smollm2.is_converted() or smollm2.find_gguf() is not None


def ensure_alias(alias: str) -> Path:
    """The directory behind ``synthetic-target`` / ``synthetic-draft``, building the pair first if needed.

    Any complete pair in the default place is used: ``ssd-chat make-pair`` may have built it with other
    settings; otherwise it is built with the defaults (seed 0).
    """
    assert alias in ALIASES, alias
    pair_dir = default_pair_dir()
    if not is_built(pair_dir):
        build_pair(pair_dir)
    return pair_dir / ("target" if alias == TARGET_ALIAS else "draft")


def build_pair(
    out_dir: Path,
    *,
    seed: int = 0,
    draft_layers: int = DEFAULT_DRAFT_LAYERS,
    damping: float = DEFAULT_DAMPING,
    shape: PairShape | None = None,
    head_vocab: int = DEFAULT_HEAD_VOCAB,
) -> tuple[Path, Path]:
    """Write ``out_dir/target`` and ``out_dir/draft``; return them. Same settings, same bytes.

    A pair already built there with the same settings is kept, one built with other settings replaced;
    a directory holding anything else is refused rather than overwritten.
    """
    settings = PairSettings(seed=seed, draft_layers=draft_layers, damping=damping, shape=shape or PairShape(),
                            head_vocab=head_vocab)
    out_dir = Path(out_dir).expanduser().resolve()
    paths = out_dir / "target", out_dir / "draft"
    if is_built(out_dir, settings):
        return paths
    if out_dir.exists() and not is_built(out_dir) and any(out_dir.iterdir()):
        raise InvalidParameterError(f"{out_dir} exists and holds no synthetic pair: give a new or empty directory")
    tokenizer_dir = smollm2.ensure_converted()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with smollm2._file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if not is_built(out_dir, settings):  # another process may have built it while we waited
            _build_atomically(settings, tokenizer_dir, out_dir)
    return paths


def _build_atomically(settings: PairSettings, tokenizer_dir: Path, out_dir: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        started = time.perf_counter()
        logger.info("building a synthetic pair in %s (%s)", out_dir, settings)
        vocab_size = _vocab_size(tokenizer_dir / "tokenizer.json")
        if settings.head_vocab > vocab_size:
            raise InvalidParameterError(f"head_vocab takes at most the vocabulary's {vocab_size} tokens (0: all); "
                                        f"got {settings.head_vocab}")
        target = target_state_dict(settings, vocab_size)
        draft = draft_state_dict(target, settings.draft_layers)
        tied = not settings.head_vocab
        for sub, tensors, num_layers, reduced in (("target", target, settings.shape.num_layers, False),
                                                  ("draft", draft, settings.draft_layers, not tied)):
            _save(tmp / sub, settings.shape, vocab_size, num_layers, tensors, tied=tied, reduced_head=reduced)
            for name in TOKENIZER_FILES:
                if (tokenizer_dir / name).is_file():
                    shutil.copyfile(tokenizer_dir / name, tmp / sub / name)
        (tmp / MARKER_NAME).write_text(json.dumps(asdict(settings)))
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the final directory should look like any other
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
        logger.info("built the synthetic pair in %.1f s", time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _vocab_size(tokenizer_json: Path) -> int:
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values()) + [token["id"] for token in data.get("added_tokens", [])]
    return max(ids) + 1


def projection_shapes(s: PairShape) -> dict[str, tuple[int, int]]:
    """A decoder layer's projections: name -> (out_features, in_features)."""
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    return {
        "self_attn.q_proj": (q_out, s.hidden_size),
        "self_attn.k_proj": (kv_out, s.hidden_size),
        "self_attn.v_proj": (kv_out, s.hidden_size),
        "self_attn.o_proj": (s.hidden_size, q_out),
        "mlp.gate_proj": (s.intermediate_size, s.hidden_size),
        "mlp.up_proj": (s.intermediate_size, s.hidden_size),
        "mlp.down_proj": (s.hidden_size, s.intermediate_size),
    }


def target_state_dict(settings: PairSettings, vocab_size: int) -> dict[str, torch.Tensor]:
    """The target's tensors, drawn in a fixed order from a generator seeded with ``settings.seed``."""
    import torch

    s = settings.shape
    per_layer = projection_shapes(s)
    generator = torch.Generator().manual_seed(settings.seed)
    tensors = {"model.embed_tokens.weight": EMBED_STD * torch.randn(vocab_size, s.hidden_size, generator=generator)}
    for layer in range(s.num_layers):
        for name, (out_features, in_features) in per_layer.items():
            std = 1.0 / math.sqrt(in_features)
            if name.endswith(("o_proj", "down_proj")) and layer >= settings.draft_layers:
                std *= settings.damping  # the deep layers only nudge what the draft's layers computed
            weight = std * torch.randn(out_features, in_features, generator=generator)
            tensors[f"model.layers.{layer}.{name}.weight"] = weight
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(s.hidden_size)
        tensors[f"model.layers.{layer}.post_attention_layernorm.weight"] = torch.ones(s.hidden_size)
    # Random signs on the final norm: the residual stream stays close to the input token's embedding,
    # and with a tied head an all-ones norm makes every greedy step repeat the input token ("\n\n\n...").
    signs = torch.randint(0, 2, (s.hidden_size,), generator=generator) * 2 - 1
    tensors["model.norm.weight"] = signs.to(torch.float32)
    if settings.head_vocab:  # an untied copy of the embedding that can only emit the first head_vocab ids
        head = tensors["model.embed_tokens.weight"].clone()
        head[settings.head_vocab :] = 0.0
        tensors["lm_head.weight"] = head
    return tensors


def draft_state_dict(target: dict[str, torch.Tensor], draft_layers: int) -> dict[str, torch.Tensor]:
    """The target's embedding, final norm and first ``draft_layers`` layers: the same tensors."""
    def keep(name: str) -> bool:
        return not name.startswith("model.layers.") or int(name.split(".")[2]) < draft_layers

    return {name: tensor for name, tensor in target.items() if keep(name)}


def _save(out: Path, shape: PairShape, vocab_size: int, num_layers: int, tensors: dict[str, torch.Tensor], *,
          tied: bool, reduced_head: bool) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim, max_position_embeddings=shape.max_position_embeddings, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta}, tie_word_embeddings=tied,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, dtype="float32",
    )
    if reduced_head:
        config.reduced_head = True  # our engine scores only the head's non-zero rows; transformers ignores it
    with torch.device("meta"):  # no throw-away random init: the tensors are assigned below
        model = LlamaForCausalLM(config)
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    with quiet_transformers():
        model.save_pretrained(out)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars from save_pretrained / from_pretrained (this is tooling, its caller reports)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
