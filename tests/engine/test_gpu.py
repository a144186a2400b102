"""CUDA paths against the CPU reference (skipped without CUDA): flashinfer vs SDPA, graphs vs eager, and greedy
SD / SSD vs AR on the GPU. scripts/gpu_check.py runs these with `pytest -m gpu`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import SdpaBackend, SeqSpan, build_metadata, flashinfer_installed
from engine.config import SpeculationConfig
from engine.synthetic import PairShape

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
needs_flashinfer = pytest.mark.skipif(not flashinfer_installed(), reason="needs flashinfer (pip install -e '.[gpu]')")

DEVICE = torch.device("cuda", 0)
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Speculative decoding works because"]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[2] / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A small correlated pair with head_dim 64 (flashinfer's kernels take 64, 128, 256)."""
    gc = _gpu_check()
    target, draft = PairShape(256, 512, 3, 4, 2, 64), PairShape(128, 256, 2, 2, 2, 64)
    return gc.build_pair(tmp_path_factory.mktemp("gpu-pair"), target, draft, damping=0.3, smoke=True, device="cuda")


def _spans_steps():
    """(write slots, spans) per step: prefill, prefill after a cached prefix, a 2-row decode (one row on scratch
    slots, as SSD branches), and a 3-query masked step (a branch tree after a shared path)."""
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    masked = torch.cat([torch.ones(3, 14, dtype=torch.bool), tree], 1)  # [3, 17]
    scratch = torch.tensor([*range(6), 40])
    return [
        (slice(0, 10), [SeqSpan(0, 10, slice(0, 10), 10)]),
        (slice(10, 14), [SeqSpan(0, 4, slice(0, 14), 14)]),
        ([14, 40], [SeqSpan(0, 1, slice(0, 15), 15), SeqSpan(1, 1, scratch, 7)]),
        ([41, 42, 43], [SeqSpan(0, 3, torch.tensor([*range(14), 41, 42, 43]), 17, masked)]),
    ]


@needs_flashinfer
def test_flashinfer_matches_sdpa():
    from engine.attention.flashinfer import FlashInferBackend

    heads, kv_heads, dim, dtype = 8, 2, 128, torch.bfloat16
    backends = [SdpaBackend(), FlashInferBackend()]
    for b in backends:
        b.allocate(num_layers=1, num_slots=64, num_kv_heads=kv_heads, head_dim=dim, dtype=dtype, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for write, spans in _spans_steps():
        n = sum(s.q_len for s in spans)
        q, k, v = (torch.randn(n, h, dim, generator=gen, device=DEVICE, dtype=dtype)
                   for h in (heads, kv_heads, kv_heads))
        meta = build_metadata(write, spans, device=DEVICE, batch_decode=True)  # SDPA batches decode steps
        outs = [b.forward(0, q, k, v, meta, dim**-0.5) for b in backends]
        torch.testing.assert_close(outs[1], outs[0], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("flashinfer", marks=needs_flashinfer)])
def test_graphs_match_eager(pair, attention):
    outs = {}
    for eager in (True, False):
        with LLM(str(pair / "target"), device="cuda:0", attention=attention, eager=eager, max_model_len=1024,
                 enable_prefix_caching=False) as llm:  # SDPA: graphs of 256, 512 and 1024 keys; steps replay 256
            assert (llm.core.runner.graphs is None) == eager
            outs[eager] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            if not eager:
                assert llm.core.runner.graphs.num_replays.get(1, 0) > 0
                if attention == "sdpa":
                    assert set(llm.core.runner.graphs.num_key_replays) == {256}
    assert outs[False] == outs[True]


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("flashinfer", marks=needs_flashinfer)])
def test_verify_graphs_match_eager(pair, attention):
    """SD and SSD with the target's k + 1-row verification (and the draft's glue pass) on captured graphs: the
    same tokens as eager."""
    outs = {}
    for eager in (True, False):
        with LLM(str(pair / "target"), draft=str(pair / "draft"), device="cuda:0", attention=attention, eager=eager,
                 max_model_len=1024, enable_prefix_caching=False) as llm:
            for mode in ("sd", "ssd"):
                llm.speculation = SpeculationConfig(mode=mode, k=4)
                outs[eager, mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            if not eager:
                assert sum(n for rows, n in llm.core.runner.graphs.num_replays.items() if rows > 1) > 0
    assert outs[False, "sd"] == outs[True, "sd"]
    assert outs[False, "ssd"] == outs[True, "ssd"]


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("flashinfer", marks=needs_flashinfer)])
def test_greedy_sd_and_ssd_equal_ar_on_cuda(pair, attention):
    with LLM(str(pair / "target"), draft=str(pair / "draft"), device="cuda:0", attention=attention,
             max_model_len=256) as llm:
        results = {}
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4)
            results[mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert results["sd"] == results["ar"]
    assert results["ssd"] == results["ar"]


def test_bf16_is_the_default_on_cuda(pair):
    with LLM(str(pair / "target"), device="cuda:0", max_model_len=128) as llm:
        assert next(llm.core.runner.model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("flashinfer", marks=needs_flashinfer)])
def test_chunked_prefill_on_cuda_equals_ar_in_every_mode(pair, attention):
    """A 300-token prompt in chunks of 64 (the paged prefill after a prefix, chunk after chunk), the draft's too:
    greedy SD and SSD equal AR."""
    prompt = [(37 * i + 11) % 250 + 3 for i in range(300)]  # the pair's vocabulary is a small BPE's
    results = {}
    with LLM(str(pair / "target"), draft=str(pair / "draft"), device="cuda:0", attention=attention,
             max_model_len=1024, prefill_chunk_tokens=64, enable_prefix_caching=False) as llm:
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4)
            results[mode] = llm.generate([prompt], GREEDY)[0].token_ids
        assert llm.core.prefill_chunk == 64
    assert results["sd"] == results["ar"] and results["ssd"] == results["ar"]
