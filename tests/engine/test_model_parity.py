"""Our Llama-3 / Qwen3 forward matches transformers' in fp32, through the paged KV cache."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.attention import SdpaBackend, SeqSpan, build_metadata
from engine.loader import build_model
from tests.conftest import make_tiny_model_dir

CASES = [
    ("llama", False, False),
    ("llama", True, False),
    ("llama", False, True),
    ("qwen3", True, False),
    ("qwen3", False, True),
]


@pytest.mark.parametrize(("family", "tied", "rope_scaling"), CASES)
def test_logits_match_transformers(tmp_path, family, tied, rope_scaling):
    path = make_tiny_model_dir(tmp_path, family=family, tied=tied, rope_scaling=rope_scaling)
    cfg = json.loads((path / "config.json").read_text())
    model = build_model(cfg, [path / "model.safetensors"], max_positions=256, dtype=torch.float32,
                        device=torch.device("cpu"))
    backend = SdpaBackend()
    backend.allocate(num_layers=model.args.num_layers, num_slots=256, num_kv_heads=model.num_kv_heads_local,
                     head_dim=model.args.head_dim, dtype=torch.float32, device=torch.device("cpu"))
    ids = torch.randint(0, model.args.vocab_size, (150,), generator=torch.Generator().manual_seed(1))
    # Positions past original_max_position_embeddings=64 exercise the llama3 scaling. The sequence is
    # run as a prefill, a second prefill over a cached prefix, then single-token decodes, and written
    # to non-contiguous slots (gather path) for the second half.
    chunks = [(0, 70), (70, 120)] + [(i, i + 1) for i in range(120, 150)]
    slot_of = list(range(0, 100)) + list(range(200, 250))[::-1]
    outs = []
    with torch.no_grad():
        for s, e in chunks:
            meta = build_metadata(slot_of[s:e], [SeqSpan(0, e - s, torch.tensor(slot_of[:e]), e)])
            outs.append(model.compute_logits(model(ids[s:e], torch.arange(s, e), meta, backend)))
        ours = torch.cat(outs)
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(ids[None]).logits[0]
    scale = ref.abs().max().item()
    assert (ours - ref).abs().max().item() <= 1e-4 * scale


def test_custom_mask_equals_causal(tmp_path):
    """A multi-token query with an explicit causal mask gives the same logits as the causal path."""
    path = make_tiny_model_dir(tmp_path, family="llama")
    cfg = json.loads((path / "config.json").read_text())
    model = build_model(cfg, [path / "model.safetensors"], max_positions=64, dtype=torch.float32,
                        device=torch.device("cpu"))
    ids = torch.randint(0, model.args.vocab_size, (20,), generator=torch.Generator().manual_seed(2))

    def run(mask):
        backend = SdpaBackend()
        backend.allocate(num_layers=model.args.num_layers, num_slots=64, num_kv_heads=model.num_kv_heads_local,
                         head_dim=model.args.head_dim, dtype=torch.float32, device=torch.device("cpu"))
        with torch.no_grad():
            meta = build_metadata(range(15), [SeqSpan(0, 15, slice(0, 15), 15)])
            model(ids[:15], torch.arange(15), meta, backend)
            meta = build_metadata(range(15, 20), [SeqSpan(0, 5, slice(0, 20), 20, mask)])
            return model.compute_logits(model(ids[15:], torch.arange(15, 20), meta, backend))

    causal = torch.arange(20)[None, :] <= (torch.arange(5)[:, None] + 15)
    assert torch.allclose(run(None), run(causal), atol=1e-5)
    # and a mask that hides the previous query tokens changes the result
    assert not torch.allclose(run(None), run(causal & (torch.arange(20)[None, :] < 15)), atol=1e-3)
