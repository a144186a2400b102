"""`ssd-chat distill`'s draft model: the target's first layers with a reduced-vocabulary head, and how it is saved.

The draft starts as the target's embedding (shared and frozen), its first ``num_layers`` layers and final norm
(copies, trained), and an untied head made of the target head's rows for the kept tokens (trained). It scores
only those tokens: ``logits`` is [B, T, Vr]. Saved, it is a plain Hugging Face directory of the target's
architecture whose full [V, D] head has zero rows outside the kept tokens and whose config says
``"reduced_head": true`` (our engine then scores just the non-zero rows; transformers loads it as is), with
the target's tokenizer and chat template files.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch
from torch import nn

from engine.synthetic import TOKENIZER_FILES, quiet_transformers

EXTRA_FILES = ("special_tokens_map.json", "generation_config.json")  # copied from the target when present


def load_target(target_dir: Path) -> nn.Module:
    """The target as a frozen fp32 transformers model (the teacher)."""
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    model.requires_grad_(False)
    return model


class DraftModel(nn.Module):
    """The draft being trained: ``lm.model`` (embedding, layers, norm) plus ``head`` over ``head_ids`` only."""

    def __init__(self, lm: nn.Module, head: torch.Tensor, head_ids: torch.Tensor):
        super().__init__()
        self.lm = lm
        self.head = nn.Parameter(head)  # [Vr, D]
        self.register_buffer("head_ids", head_ids, persistent=False)  # [Vr]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, Vr]
        hidden = self.lm.model(input_ids=input_ids).last_hidden_state  # [B, T, D]
        return hidden @ self.head.T

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


def save_draft(draft: DraftModel, target_dir: Path, out_dir: Path) -> None:
    """Write ``out_dir`` as a model directory: config.json, model.safetensors, the target's tokenizer files."""
    lm = draft.lm
    with torch.no_grad():
        lm.lm_head.weight = nn.Parameter(draft.full_head(), requires_grad=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        lm.save_pretrained(out_dir)
    for name in (*TOKENIZER_FILES, *EXTRA_FILES):
        if (target_dir / name).is_file():
            shutil.copyfile(target_dir / name, out_dir / name)


def num_params_per_token(draft: DraftModel) -> int:
    """Parameters one draft token reads: the layers, the norm and the kept head rows (not the embedding table)."""
    layers = sum(p.numel() for p in draft.lm.model.layers.parameters()) + draft.lm.model.norm.weight.numel()
    return layers + draft.head.numel()
