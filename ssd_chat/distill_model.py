"""`ssd-chat distill`'s draft model: the target's first layers with a reduced-vocabulary head, and how it is saved.

The draft starts as the target's embedding (shared and frozen), its first ``num_layers`` layers and final norm
(copies, trained), and an untied head made of the target head's rows for the kept tokens (trained). It scores
only those tokens: ``logits`` is [B, T, Vr].

Saved, it is a Hugging Face directory of the target's architecture with the target's tokenizer and chat
template files, made small: the matmul weights are int8 with float32 row scales (``distill_config.SAVE_WEIGHTS``,
the form the engine's default int8 draft products run: engine.layers.low_bits.int8_rows; or float16), the norms
float16, the input embedding is left out (config ``"embedding_from_target": true``: the engine reads the
target's), and the head holds only the kept rows [Vr, D] plus ``lm_head.vocab_ids`` [Vr] (config
``"reduced_head": true``). For SmolLM2-135M with 4 layers and 8192 kept tokens that is 38 MB in float16 instead
of 188 MB. transformers cannot load such a directory by itself: ``load_hf_draft`` rebuilds the full model from
it and the target (for the transformers reference rows).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch
from torch import nn

from engine.layers.low_bits import int8_rows
from engine.loader import SCALE_SUFFIX, dequantize
from engine.synthetic import TOKENIZER_FILES, quiet_transformers

EXTRA_FILES = ("special_tokens_map.json", "generation_config.json")  # copied from the target when present
WEIGHTS = "model.safetensors"


def load_target(target_dir: Path) -> nn.Module:
    """The target as a frozen fp32 transformers model (the teacher)."""
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    model.requires_grad_(False)
    return model


def target_eos_ids(target: nn.Module) -> list[int]:
    """The target's end-of-sequence ids, its config's then its generation config's, each once: the head always
    keeps them, and the first pads a batch."""
    ids: list[int] = []
    for source in (target.config.eos_token_id, getattr(target.generation_config, "eos_token_id", None)):
        for token in source if isinstance(source, list) else [] if source is None else [source]:
            if token not in ids:
                ids.append(int(token))
    return ids


class DraftModel(nn.Module):
    """The draft being trained: ``lm.model`` (embedding, layers, norm) plus ``head`` over ``head_ids`` only."""

    def __init__(self, lm: nn.Module, head: torch.Tensor, head_ids: torch.Tensor):
        super().__init__()
        self.lm = lm
        self.head = nn.Parameter(head)  # [Vr, D]
        self.register_buffer("head_ids", head_ids, persistent=False)  # [Vr]

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, D]
        return self.lm.model(input_ids=input_ids).last_hidden_state

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, Vr]
        return self.hidden(input_ids) @ self.head.T

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What training changes (the frozen embedding is the target's): checkpointed and restored."""
        return {name: p.detach() for name, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.named_parameters())
        assert set(state) == {n for n, p in params.items() if p.requires_grad}, "checkpoint of another draft"
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)

    def full_head(self) -> torch.Tensor:  # [V, D], zero outside head_ids
        vocab_size = self.lm.config.vocab_size
        full = self.head.new_zeros(vocab_size, self.head.shape[1])
        return full.index_copy_(0, self.head_ids, self.head.detach())


def init_draft(target: nn.Module, num_layers: int, head_ids: torch.Tensor) -> DraftModel:
    """A draft of the target's architecture: its embedding (shared, frozen), first layers and norm (copied)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:num_layers]
    config.tie_word_embeddings = False
    config.reduced_head = True  # read by our engine (engine.models.args); transformers keeps it as an attribute
    with quiet_transformers():
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    body = {name: tensor for name, tensor in target.model.state_dict().items()
            if not name.startswith("layers.") or int(name.split(".")[1]) < num_layers}
    lm.model.load_state_dict({n: t.clone() for n, t in body.items()})
    lm.model.embed_tokens.weight = target.model.embed_tokens.weight  # shared with the teacher, frozen
    lm.model.embed_tokens.weight.requires_grad_(False)
    lm.lm_head.weight.requires_grad_(False)  # replaced by DraftModel.head; written back on save
    head = target.lm_head.weight.detach()[head_ids].clone()  # [Vr, D]
    return DraftModel(lm, head, head_ids)


def save_draft(draft: DraftModel, target_dir: Path, out_dir: Path, weights: str = "int8") -> None:
    """Write ``out_dir`` as a draft directory: config.json, model.safetensors (matmul weights in `weights`, one of
    distill_config.SAVE_WEIGHTS), the target's tokenizer files."""
    from safetensors.torch import save_file

    config = copy.deepcopy(draft.lm.config)
    config.reduced_head = True
    config.embedding_from_target = True  # read by our engine (engine.models.args); see load_hf_draft
    state = {f"model.{name}": t for name, t in draft.lm.model.state_dict().items() if name != "embed_tokens.weight"}
    state["lm_head.weight"] = draft.head  # [Vr, D]
    tensors = {}
    for name, tensor in state.items():
        if weights == "int8" and tensor.dim() == 2:  # the matmuls' weights (the norms are 1-D)
            tensors[name], tensors[name + SCALE_SUFFIX] = int8_rows(tensor)
        else:
            tensors[name] = tensor.detach().to(torch.float16)
    tensors = {name: t.contiguous() for name, t in tensors.items()}
    tensors["lm_head.vocab_ids"] = draft.head_ids.to(torch.int64).contiguous()  # [Vr]
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    tmp = out_dir / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / WEIGHTS)
    for name in (*TOKENIZER_FILES, *EXTRA_FILES):
        if (target_dir / name).is_file():
            shutil.copyfile(target_dir / name, out_dir / name)


def load_hf_draft(draft_dir: Path, target_dir: Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A draft directory as a plain transformers model: a compact draft gets the target's embedding and a full
    [V, D] head that is zero outside its kept tokens; any other model directory loads as it is."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(draft_dir)
    with quiet_transformers():
        if not getattr(config, "embedding_from_target", False):
            return AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).eval()
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    state = load_file(str(Path(draft_dir) / WEIGHTS))
    for name in [n for n in state if n + SCALE_SUFFIX in state]:  # int8 weights and their row scales
        state[name] = dequantize(state[name], state.pop(name + SCALE_SUFFIX))
    ids, rows = state.pop("lm_head.vocab_ids"), state.pop("lm_head.weight")
    state["lm_head.weight"] = rows.new_zeros(config.vocab_size, rows.shape[1]).index_copy_(0, ids, rows)
    state["model.embed_tokens.weight"] = _target_embedding(Path(target_dir))
    model.load_state_dict({name: t.to(dtype) for name, t in state.items()}, strict=True)
    return model


def _target_embedding(target_dir: Path) -> torch.Tensor:
    from safetensors import safe_open

    from engine.model_dir import inspect_model_dir

    for path in inspect_model_dir(target_dir).weight_files:
        with safe_open(str(path), framework="pt") as f:
            if "model.embed_tokens.weight" in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                return f.get_tensor("model.embed_tokens.weight")
    raise FileNotFoundError(f"{target_dir} has no model.embed_tokens.weight")


def num_params_per_token(draft: DraftModel) -> int:
    """Parameters one draft token reads: the layers, the norm and the kept head rows (not the embedding table)."""
    layers = sum(p.numel() for p in draft.lm.model.layers.parameters()) + draft.lm.model.norm.weight.numel()
    return layers + draft.head.numel()
