"""gpu_check's random pair, no downloads: a Llama-3.1-8B-shaped target and a Llama-3.2-1B-shaped draft (tiny
shapes for --smoke) with random weights that agree on most greedy tokens without training.

The heads are tied; the tokenizer is the SmolLM2 one when it is on this machine, else a byte-level BPE (the
vocabulary is the tokenizer's). The target's embedding is the draft's repeated twice ([E, E]: the same directions,
so tied heads score tokens alike), the final-norm signs likewise, and every layer's output projections are damped,
so both residual streams stay close to the input token's embedding (the damped-deep-layers trick of
engine.synthetic). Used by scripts/gpu_check.py and scripts/gpu_profile.py, with scripts/ on the path.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch

from engine.synthetic import PairShape, projection_shapes

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Speculative decoding works because"]
MARKER = "gpu-check-pair.json"


TARGET_8B = PairShape(4096, 14336, 32, 32, 8, 128, 4096, 500000.0)  # Llama-3.1-8B
DRAFT_1B = PairShape(2048, 8192, 16, 32, 8, 64, 4096, 500000.0)     # Llama-3.2-1B
SMOKE_TARGET = PairShape(64, 128, 4, 4, 2, 16, 4096, 500000.0)
SMOKE_DRAFT = PairShape(32, 64, 2, 4, 2, 8, 4096, 500000.0)


def build_pair(out_dir: Path, target: PairShape, draft: PairShape, *, damping: float, smoke: bool, device: str) -> Path:
    """out_dir/target and out_dir/draft (kept: a rerun with the same settings reuses them)."""
    settings = {"target": asdict(target), "draft": asdict(draft), "damping": damping, "smoke": smoke}
    marker = out_dir / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == settings:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = _write_tokenizer(out_dir / "tokenizer", smoke=smoke)
    vocab = _vocab_size(tokenizer_dir)
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    embed = torch.randn(vocab, draft.hidden_size, generator=gen, device=device)  # std 1: decisive tied logits
    signs = (torch.randint(0, 2, (draft.hidden_size,), generator=gen, device=device) * 2 - 1).float()
    for name, shape, emb, sign in (("draft", draft, embed, signs),
                                   ("target", target, torch.cat([embed, embed], 1), torch.cat([signs, signs]))):
        assert emb.shape[1] == shape.hidden_size, "the target's hidden size must be twice the draft's"
        tensors = {"model.embed_tokens.weight": emb, "model.norm.weight": sign}
        for layer in range(shape.num_layers):
            tensors |= _layer(shape, layer, damping, gen, device)
        _save(out_dir / name, shape, vocab, {k: v.to(dtype).cpu() for k, v in tensors.items()}, tokenizer_dir, dtype)
    marker.write_text(json.dumps(settings))
    return out_dir


def _layer(s: PairShape, layer: int, damping: float, gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, (rows, cols) in projection_shapes(s).items():
        std = (damping if name.endswith(("o_proj", "down_proj")) else 1.0) / math.sqrt(cols)
        out[f"model.layers.{layer}.{name}.weight"] = std * torch.randn(rows, cols, generator=gen, device=device)
    for norm in ("input_layernorm", "post_attention_layernorm"):
        out[f"model.layers.{layer}.{norm}.weight"] = torch.ones(s.hidden_size, device=device)
    return out


def _save(out: Path, s: PairShape, vocab: int, tensors: dict, tokenizer_dir: Path, dtype: torch.dtype) -> None:
    import shutil

    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=vocab, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads,
                head_dim=s.head_dim, max_position_embeddings=s.max_position_embeddings, rms_norm_eps=1e-5,
                tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
                architectures=["LlamaForCausalLM"], dtype=str(dtype).removeprefix("torch.")).save_pretrained(out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in tokenizer_dir.iterdir():
        shutil.copyfile(f, out / f.name)


def _write_tokenizer(out: Path, *, smoke: bool) -> Path:
    """The SmolLM2 tokenizer when it is converted on this machine (a real vocabulary), else a byte-level BPE."""
    from engine import smollm2

    out.mkdir(parents=True, exist_ok=True)
    if not smoke and smollm2.is_converted():
        import shutil

        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (smollm2.converted_dir() / name).is_file():
                shutil.copyfile(smollm2.converted_dir() / name, out / name)
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(PROMPTS * 4, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>") \
        .save_pretrained(out)
    return out


def _vocab_size(tokenizer_dir: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tokenizer_dir))
