"""The CPU's compiled decode step (--compile): same greedy tokens as eager, one graph for every key count,
only the steps it can run, and an eager fallback when compiling fails."""

from __future__ import annotations

import logging

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.base import SeqSpan
from engine.build import fast_kwargs
from engine.compiled_decode import CompiledDecode
from engine.config import FastPath, SpeculationConfig
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

pytestmark = pytest.mark.slow  # compiles two tiny models with inductor (a C++ build each, ~30 s cold)


@pytest.fixture(scope="module", params=["llama", "qwen3", "llama-head-dim-64"])
def model_dir(request, tiny_llama_dir, tiny_qwen3_dir, wide_heads_dir):
    """Head dims 16 and 32 take attend()'s matmul route; 64 takes torch's SDPA kernel, as real models do."""
    if request.param == "llama-head-dim-64":
        return wide_heads_dir
    return tiny_llama_dir if request.param == "llama" else tiny_qwen3_dir


def test_without_the_flag_the_cpu_runner_is_eager(tiny_llama_dir):
    cpu = torch.device("cpu")
    off, on = FastPath(), FastPath(compile=True)
    assert fast_kwargs(off, cpu, tp=1, max_keys=64, rows=True) == {"compile_decode": False, "compile_rows": False}
    assert fast_kwargs(on, cpu, tp=1, max_keys=64) == {"compile_decode": True, "compile_rows": False}
    assert fast_kwargs(on, cpu, tp=2, max_keys=64, rows=True)["compile_decode"] is False
    with LLM(str(tiny_llama_dir), max_model_len=128) as llm:
        assert llm.core.runner.compiled is None and "compiled" not in llm.layout["target"]


def test_compiled_decode_gives_the_eager_greedy_output(model_dir):
    """Block size 4: keys cross block boundaries every 4 tokens; batches and prefill stay eager."""
    with LLM(str(model_dir), max_model_len=128, block_size=4) as eager:
        want = [eager.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    with LLM(str(model_dir), max_model_len=128, block_size=4, compile=True) as llm:
        compiled = llm.core.runner.compiled
        assert compiled is not None and compiled.available
        assert "compiled" in llm.layout["target"]  # the chat's panel and the bench JSON show it
        got = [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
        single = compiled.num_runs
        assert single >= len(PROMPTS) * (GREEDY.max_tokens - 2)  # nearly every decode step ran compiled
        batched = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]  # batches of 5 rows: eager
        assert compiled.num_runs == single
    assert got == want and batched == want


def test_one_graph_serves_every_key_count(tiny_llama_dir):
    from torch._dynamo.utils import counters

    with LLM(str(tiny_llama_dir), max_model_len=128, block_size=4, compile=True) as llm:
        before = counters["stats"]["unique_graphs"]
        llm.generate(["The quick brown fox"], GREEDY)  # 40 steps, key counts 5..44
        assert llm.core.runner.compiled.num_runs >= GREEDY.max_tokens - 2
        assert counters["stats"]["unique_graphs"] == before  # no recompile after the warm-up


def test_speculative_modes_with_compile_equal_eager_ar(tiny_llama_dir, tmp_path):
    """With a draft, the target's verification rows and prefill run the several-row graph; the draft's
    single-token steps and catch-up rows run its own."""
    draft = noisy_copy(tiny_llama_dir, tmp_path / "draft", scale=0.1, seed=3)
    with LLM(str(tiny_llama_dir), max_model_len=128, block_size=4) as eager:
        want = [o.token_ids for o in eager.generate(PROMPTS[:3], GREEDY)]
    from torch._dynamo.utils import counters

    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=128, block_size=4, compile=True) as llm:
        target, drafter = llm.core.runner.compiled, llm.core.drafter.runner.compiled
        assert target.rows and drafter.rows
        graphs = counters["stats"]["unique_graphs"]
        llm.speculation = SpeculationConfig(mode="sd", k=3, adaptive_k=False)
        assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids == want[0]  # a fresh engine: consecutive blocks
        assert target.num_runs >= GREEDY.max_tokens // 4  # prefill and every verify step
        assert drafter.num_runs >= GREEDY.max_tokens  # the draft's steps and catch-up rows
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3)
            assert [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS[:3]] == want, mode
        assert counters["stats"]["unique_graphs"] == graphs  # the start-up compiles cover every step


def test_only_single_token_decode_over_one_slot_run_is_handled():
    step = CompiledDecode.__new__(CompiledDecode)
    step.available, step.rows = True, False
    decode = SeqSpan(0, 1, slice(8, 20), 12)
    assert step.handles(slice(19, 20), [decode])
    assert not step.handles(slice(19, 20), [decode, decode])  # a batch
    rows = SeqSpan(0, 8, slice(8, 20), 12)  # several causal query rows (verification, prefill)
    assert not step.handles(slice(12, 20), [rows])  # not without `rows`
    step.rows = True
    assert step.handles(slice(12, 20), [rows]) and step.handles(slice(19, 20), [decode])
    masked = SeqSpan(0, 8, slice(8, 20), 12, torch.ones(8, 12, dtype=torch.bool))
    assert not step.handles(slice(12, 20), [masked])  # a custom mask (SSD branches): eager
    assert not step.handles(torch.tensor([19]), [SeqSpan(0, 1, torch.arange(8, 20), 12)])  # scattered blocks
    assert not step.handles(slice(5, 6), [decode])  # writes elsewhere than the last key
    assert not step.handles(slice(8, 9), [SeqSpan(0, 1, slice(8, 9), 1)])  # no key before the new one
    assert not step.handles(slice(19, 20), [SeqSpan(0, 1, slice(8, 20), 11)])  # key count != slot count
    assert not step.handles(slice(0, 8), [SeqSpan(0, 8, slice(0, 8), 8)])  # rows written from slot 0: eager
    step.available = False
    assert not step.handles(slice(19, 20), [decode])


def test_a_failed_recompile_mid_reply_falls_back_to_eager(tiny_llama_dir, caplog):
    with LLM(str(tiny_llama_dir), max_model_len=128) as eager:
        want = eager.generate(["Paris is"], GREEDY)[0].token_ids
    with LLM(str(tiny_llama_dir), max_model_len=128, compile=True) as llm:
        compiled = llm.core.runner.compiled
        calls = []

        def failing_step(*args):
            calls.append(1)
            if len(calls) > 5:
                raise RuntimeError("recompile limit hit")
            return step(*args)

        step, compiled.step = compiled.step, failing_step
        with caplog.at_level(logging.WARNING, logger="engine.compiled_decode"):
            assert llm.generate(["Paris is"], GREEDY)[0].token_ids == want
        assert not compiled.available and len(calls) == 6  # five compiled steps, then eager for good
    assert any("recompile limit hit" in r.getMessage() for r in caplog.records)


def test_a_failed_compile_falls_back_to_eager_with_one_warning(tiny_llama_dir, monkeypatch, caplog):
    def broken_compile(fn, **kwargs):
        def step(*args):
            raise RuntimeError("no C++ compiler found")
        return step

    monkeypatch.setattr(torch, "compile", broken_compile)
    with LLM(str(tiny_llama_dir), max_model_len=128) as eager:
        want = eager.generate(["Paris is"], GREEDY)[0].token_ids
    with (caplog.at_level(logging.WARNING, logger="engine.compiled_decode"),
          LLM(str(tiny_llama_dir), max_model_len=128, compile=True) as llm):
        assert not llm.core.runner.compiled.available and "compiled" not in llm.layout["target"]
        assert llm.generate(["Paris is"], GREEDY)[0].token_ids == want
    warnings = [r.getMessage() for r in caplog.records if r.name == "engine.compiled_decode"]
    assert len(warnings) == 1 and "running eager" in warnings[0] and "no C++ compiler" in warnings[0]


@pytest.mark.slow  # compiles the tiny model's graph
def test_bench_reports_the_share_of_compiled_steps_over_chats_sharing_a_prefix(tiny_llama_dir):
    from ssd_chat.bench import BenchConfig, run_engine_mode

    system = list(range(3, 19))  # a shared system prompt: 4 full blocks of 4
    prompts = [[*system, 30 + i, 40 + i] for i in range(4)]
    with LLM(str(tiny_llama_dir), compile=True, block_size=4) as llm:
        result = run_engine_mode(llm, SpeculationConfig(mode="ar"), prompts, BenchConfig("tiny", max_tokens=24),
                                 lambda _: None)
    # every reply continues in consecutive blocks (engine.kv.block_manager), so all but the prefills compile
    assert result.compiled_share is not None and result.compiled_share >= 0.9, result.compiled_share
    assert result.to_dict()["compiled_share"] == result.compiled_share
    with LLM(str(tiny_llama_dir), block_size=4) as llm:
        eager = run_engine_mode(llm, SpeculationConfig(mode="ar"), prompts[:1], BenchConfig("tiny", max_tokens=8),
                                lambda _: None)
        assert eager.compiled_share is None
