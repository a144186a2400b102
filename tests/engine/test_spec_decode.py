"""Sync speculative decoding: greedy output token-identical to AR, KV and prefix bookkeeping on both models."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, FinishReason, RequestFinished, SamplingParams, TokenDelta
from engine.config import SpeculationConfig
from engine.outputs import StepStats, TokenSource

PROMPTS = ["The quick brown fox", "Paris is", [5, 9, 33, 2, 71, 8, 8, 8, 100], "def add(a, b):", "Ünïcödé 東京"]


def noisy_copy(src: Path, dst: Path, scale: float, seed: int = 0) -> Path:
    """A draft that agrees with the target often but not always: its weights plus Gaussian noise."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    noisy = {k: v + scale * v.std() * torch.randn(v.shape, generator=gen) if v.dim() == 2 else v
             for k, v in weights.items()}
    save_file(noisy, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def noisy_draft_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    return noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("draft") / "noisy", scale=0.3)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, noisy_draft_dir) -> LLM:
    return LLM(str(tiny_llama_dir), draft=str(noisy_draft_dir), max_model_len=256, block_size=4)


def run(llm: LLM, prompts, params: SamplingParams, **spec) -> list:
    llm.speculation = SpeculationConfig(**spec)
    return llm.generate(prompts, params)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_sd_equals_ar(llm, k):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ar = [o.token_ids for o in run(llm, PROMPTS, params, mode="ar")]
    # batched: all prompts verify together; k fixed (the adaptive k follows measured timings, and on a loaded CI run
    # it once drafted so little that no draft was accepted)
    sd_outs = run(llm, PROMPTS, params, mode="sd", k=k, adaptive_k=False)
    assert [o.token_ids for o in sd_outs] == ar
    spec = [o.stats.spec for o in sd_outs]
    accepted, drafted = sum(s.num_accepted for s in spec), sum(s.num_drafted for s in spec)
    assert 0 < accepted < drafted  # both the accept and the reject path ran
    for out in sd_outs:
        assert out.stats.spec.num_emitted >= len(out.token_ids) - 1  # prefill gives the first token
        assert 1.0 <= out.stats.spec.tau <= k + 1


def test_bf16_on_the_cpu_keeps_its_dtype_and_sd_ssd_equal_ar(tiny_llama_dir, noisy_draft_dir):
    """--dtype bfloat16 on the CPU (the CUDA default, here on its CPU twin): rotary's float32 tables are cast to the
    activations' dtype, so q/k stay bf16 through every layer, and greedy SD and SSD still equal AR."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(str(tiny_llama_dir), draft=str(noisy_draft_dir), max_model_len=256, block_size=4, dtype="bfloat16",
             draft_weights="float32") as bf16:
        model = bf16.core.runner.model
        cos, sin = model.rotary.lookup(torch.arange(3), torch.bfloat16)
        assert cos.dtype == sin.dtype == torch.bfloat16 and model.rotary.cos.dtype == torch.float32
        assert bf16.core.runner.backend.k[0].dtype == torch.bfloat16
        ar = [o.token_ids for o in run(bf16, PROMPTS, params, mode="ar")]
        assert [o.token_ids for o in run(bf16, PROMPTS, params, mode="sd", k=3)] == ar
        assert [o.token_ids for o in run(bf16, PROMPTS, params, mode="ssd", k=3)] == ar


def test_draft_equal_to_target_accepts_everything(tiny_llama_dir):
    same = LLM(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=256, block_size=4, draft_weights="float32",
               speculation=SpeculationConfig(mode="sd", k=3, adaptive_k=False))  # adaptive: k=1 for so costly a draft
    out = same.generate(["Paris is"], SamplingParams(temperature=0.0, max_tokens=21, ignore_eos=True))[0]
    spec = out.stats.spec
    assert spec.acceptance_rate == 1.0 and spec.tau == 4.0
    same.speculation = SpeculationConfig(mode="ar")
    assert same.generate(["Paris is"], SamplingParams(temperature=0.0, max_tokens=21, ignore_eos=True))[0].token_ids \
        == out.token_ids


def test_unrelated_draft_still_exact(tiny_llama_dir, tiny_qwen3_dir, tmp_path):
    from tests.conftest import make_tiny_model_dir

    other = make_tiny_model_dir(tmp_path, family="llama", seed=7)
    llm = LLM(str(tiny_llama_dir), draft=str(other), max_model_len=256, block_size=4, k=4)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    sd = llm.generate(PROMPTS[:3], params)
    llm.speculation = SpeculationConfig(mode="ar")
    assert [o.token_ids for o in sd] == [o.token_ids for o in llm.generate(PROMPTS[:3], params)]


def test_context_limit_and_max_tokens(tiny_llama_dir, noisy_draft_dir):
    small = LLM(str(tiny_llama_dir), draft=str(noisy_draft_dir), max_model_len=24, block_size=4, k=4)
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    prompt = list(range(1, 14))
    sd = small.generate([prompt], params)[0]
    assert sd.finish_reason is FinishReason.CONTEXT and len(prompt) + len(sd.token_ids) == 24
    for max_tokens in (1, 2, 5, 6):
        p = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        small.speculation = SpeculationConfig(mode="sd", k=4)
        got = small.generate([prompt], p)[0]
        small.speculation = SpeculationConfig(mode="ar")
        want = small.generate([prompt], p)[0]
        assert got.token_ids == want.token_ids and len(got.token_ids) == max_tokens
    small.speculation = SpeculationConfig(mode="ar")
    assert small.generate([prompt], params)[0].token_ids == sd.token_ids


def test_stop_inside_accepted_tokens(llm):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ar = run(llm, ["The quick brown fox"], params, mode="ar")[0]
    stop_id = ar.token_ids[9]
    p = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_id])
    sd = run(llm, ["The quick brown fox"], p, mode="sd", k=7)[0]
    assert sd.token_ids == ar.token_ids[: ar.token_ids.index(stop_id) + 1]
    stop = ar.text[12:15]
    stop_params = SamplingParams(temperature=0.0, max_tokens=40, stop=[stop])
    want = run(llm, ["The quick brown fox"], stop_params, mode="ar")[0]
    sd = run(llm, ["The quick brown fox"], stop_params, mode="sd", k=7)[0]
    assert sd.text == want.text == ar.text[: ar.text.index(stop)]
    assert sd.token_ids == want.token_ids  # tokens drafted past the stop string are dropped too
    assert sd.finish_reason is FinishReason.STOP


def test_stream_events_carry_provenance_and_step_stats(llm):
    # a fixed k: the adaptive length may pick plain steps on a loaded machine (CI failed so), and then no
    # round need both accept and reject a draft
    llm.speculation = SpeculationConfig(mode="sd", k=3, adaptive_k=False)
    events = list(llm.stream("Paris is", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)))
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    steps = [e for e in events if isinstance(e, StepStats)]
    out = events[-1].output
    sources = [s for d in deltas for s in d.sources]
    assert len(sources) == len(out.token_ids)
    assert sources[0] is TokenSource.TARGET  # the prefill's token
    # later TARGET tokens only come from steps with nothing to draft (the last token of max_tokens)
    assert sources.count(TokenSource.TARGET) == 1 + sum(s.num_drafted == 0 for s in steps)
    assert TokenSource.RECOVERY in sources and TokenSource.ACCEPTED in sources
    assert len(steps) == out.stats.spec.num_steps
    assert sum(s.num_accepted for s in steps) == out.stats.spec.num_accepted
    assert sources.count(TokenSource.ACCEPTED) == out.stats.spec.num_accepted
    assert "".join(d.text for d in deltas) == out.text


def test_chat_turn_two_reuses_prefix_on_both_models(llm):
    llm.speculation = SpeculationConfig(mode="sd", k=4)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    history = [{"role": "user", "content": "The quick brown fox"}]
    first = _final(llm.chat(history, params))
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Paris is"}]
    second = _final(llm.chat(history, params))
    assert second.stats.reused_prefix_tokens > 0
    # both models found the same cached prefix, so both prefilled only the new tokens
    assert second.stats.spec.draft_reused_prefix_tokens == second.stats.reused_prefix_tokens
    llm.speculation = SpeculationConfig(mode="ar")
    assert _final(llm.chat(history, params)).token_ids == second.token_ids


def test_cancel_frees_blocks_on_target_and_draft(llm):
    llm.speculation = SpeculationConfig(mode="sd", k=4)
    target, draft = llm.core.blocks, llm.core.drafter.blocks
    stream = llm.stream("Paris is", SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))
    next(stream)
    next(stream)
    assert target.num_free_blocks < len(target.blocks) and draft.num_free_blocks < len(draft.blocks)
    stream.close()
    assert target.num_free_blocks == len(target.blocks) and draft.num_free_blocks == len(draft.blocks)
    assert not llm.core.drafter.seqs


def test_sd_needs_a_draft(tiny_llama_dir):
    from engine.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError):
        LLM(str(tiny_llama_dir), mode="sd")


def _final(events):
    *_, last = events
    assert isinstance(last, RequestFinished)
    return last.output


def test_a_draft_with_another_tokenizer_is_refused(tiny_llama_dir, tmp_path):
    from engine import EngineError
    from tests.engine.test_spec_sampling import small_vocab_pair

    _, other_family = small_vocab_pair(tmp_path)
    with pytest.raises(EngineError) as err:
        LLM(str(tiny_llama_dir), draft=str(other_family))
    assert "tokenizer" in str(err.value) and "\n" not in str(err.value)


def test_requests_of_several_speculation_settings_run_as_groups_in_arrival_order(llm, monkeypatch):
    """One step with requests of six settings (k 6..1) speculates group by group in the order the requests came (a
    set of the settings ran them in the order of per-process string hashes)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    order, speculate = [], type(llm.core)._speculate

    def recording(core, seqs, spec):
        order.append(spec.k)
        return speculate(core, seqs, spec)

    monkeypatch.setattr(type(llm.core), "_speculate", recording)
    before, streams = llm.speculation, []
    for k in range(6, 0, -1):
        llm.speculation = SpeculationConfig(mode="sd", k=k, adaptive_k=False)
        streams.append(llm.stream(PROMPTS[k % len(PROMPTS)], greedy))  # (added now, stepped together below)
    llm.speculation = before
    finished = [list(stream)[-1] for stream in streams]
    assert all(isinstance(f, RequestFinished) for f in finished)
    assert order[:6] == [6, 5, 4, 3, 2, 1]  # the first decode step: every group, in arrival order
