"""engine/layers/fused.py (a layer's front half in one kernel call): the eager forward's bits, row invariance kept,
the steps it must leave to the eager layers, and speculation still exact with it."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.base import SeqSpan, build_metadata
from engine.config import SpeculationConfig
from engine.layers import fused, native, panel
from engine.layers.rotary import apply_rotary

pytestmark = pytest.mark.skipif(not panel.ready(), reason="the panel kernels need AVX-512 or AVX2 and a C++ compiler")


@pytest.fixture()
def count_fused(monkeypatch):
    calls = []
    original = fused.forward

    def counting(*args, **kwargs):
        calls.append(args[2].shape[0])  # rows
        return original(*args, **kwargs)

    monkeypatch.setattr(fused, "forward", counting)
    return calls


def test_rotary_rows_are_apply_rotarys_bits():
    g = torch.Generator().manual_seed(0)
    n, heads, d = 5, 12, 64
    x = torch.randn(n, heads, d, generator=g) * 3
    cos, sin = torch.randn(n, 1, d, generator=g), torch.randn(n, 1, d, generator=g)
    expected = apply_rotary(x, cos, sin)
    out = torch.empty(n, heads, d)
    native.library().rotary_rows(x.data_ptr(), n, heads, d, heads * d, cos.contiguous().data_ptr(),
                                 sin.contiguous().data_ptr(), out.data_ptr(), heads * d)
    assert torch.equal(out, expected)


def step_logits(runner, ids, start, rows):
    """The logits of rows start.. of ids in one step (the earlier ones already in the cache)."""
    span = SeqSpan(0, rows, slice(0, start + rows), start + rows)
    return runner.run_spans(ids[start : start + rows], torch.arange(start, start + rows),
                            slice(start, start + rows), [span], all_logits=True)


def test_silu_mul_is_torchs_silu_times_up():
    """Over exp's range and edges, several rows: layer.cpp's silu copies the SLEEF exp of torch's x86 builds."""
    assert fused.silu_matches()
    g = torch.Generator().manual_seed(3)
    edges = torch.tensor([0.0, -0.0, 1e-40, 88.7, -88.7, 104.1, -104.1, 100.1, float("inf")])
    gate = torch.cat([torch.randn(3 * 480 - 9, generator=g) * 40, edges]).reshape(3, 480)
    gate_up = torch.cat([gate, torch.randn(3, 480, generator=g)], dim=1)
    out = torch.empty(3, 480)
    native.library().silu_mul(gate_up.data_ptr(), 3, 480, out.data_ptr())
    assert torch.equal(out, torch.nn.functional.silu(gate_up[:, :480]).mul_(gate_up[:, 480:]))


@pytest.mark.parametrize("whole", [True, False], ids=["whole-layers", "front-halves"])
@pytest.mark.parametrize("rows", [1, 5])
def test_fused_steps_give_the_eager_logits_bit_for_bit(wide_heads_dir, rows, whole, count_fused, monkeypatch):
    if not whole:  # a torch build whose silu is not layer.cpp's: the MLPs' back halves in Python
        monkeypatch.setattr(fused, "silu_matches", lambda: False)
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        ids = torch.randint(runner.model.args.vocab_size, (50,), generator=torch.Generator().manual_seed(1)).tolist()
        runner.run_spans(ids[:40], torch.arange(40), slice(0, 40), [SeqSpan(0, 40, slice(0, 40), 40)],
                         all_logits=False)  # the prompt (more rows than the row kernels take: eager)
        assert count_fused == []
        monkeypatch.setattr(fused, "ENABLED", False)
        eager = step_logits(runner, ids, 40, rows)
        monkeypatch.setattr(fused, "ENABLED", True)
        one_call = step_logits(runner, ids, 40, rows)  # the same slots rewritten with the same keys and values
        assert count_fused == [rows]
        assert fused.whole(runner.model._fused.plan(rows), rows, torch.get_num_threads()) == whole
        assert torch.equal(one_call, eager)


def test_a_fused_verify_gives_each_row_the_logits_of_plain_decoding(wide_heads_dir, count_fused):
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        ids = torch.randint(runner.model.args.vocab_size, (45,), generator=torch.Generator().manual_seed(2)).tolist()
        runner.run_spans(ids[:40], torch.arange(40), slice(0, 40), [SeqSpan(0, 40, slice(0, 40), 40)],
                         all_logits=False)
        verify = step_logits(runner, ids, 40, 5)
        for p in range(40, 45):
            assert torch.equal(step_logits(runner, ids, p, 1)[0], verify[p - 40]), p
        assert count_fused == [5, 1, 1, 1, 1, 1]


def test_steps_it_must_leave_to_the_eager_layers(wide_heads_dir):
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        model, backend = runner.model, runner.backend
        h = torch.zeros(2, model.args.hidden_size)
        causal = build_metadata(slice(8, 10), [SeqSpan(0, 2, slice(0, 10), 10)])
        assert fused.applies(model, h, causal, backend)
        scattered = build_metadata(slice(8, 10), [SeqSpan(0, 2, torch.tensor([*range(4), *range(16, 22)]), 10)])
        masked = build_metadata(slice(8, 10), [SeqSpan(0, 2, slice(0, 10), 10, torch.ones(2, 10, dtype=torch.bool))])
        two_sequences = build_metadata(slice(8, 10), [SeqSpan(0, 1, slice(0, 9), 9), SeqSpan(1, 1, slice(0, 10), 10)])
        index_writes = build_metadata([8, 12], [SeqSpan(0, 2, slice(0, 10), 10)])
        slots = backend.k[0].shape[1]  # the kernel writes unchecked: a bad slice stays on the eager views
        too_long = build_metadata(slice(8, 11), [SeqSpan(0, 2, slice(0, 10), 10)])
        past_the_end = build_metadata(slice(slots - 1, slots + 1), [SeqSpan(0, 2, slice(0, slots + 1), slots + 1)])
        for meta in (scattered, masked, two_sequences, index_writes, too_long, past_the_end):
            assert not fused.applies(model, h, meta, backend)
        assert not fused.applies(model, torch.zeros(33, model.args.hidden_size),
                                 build_metadata(slice(0, 33), [SeqSpan(0, 33, slice(0, 33), 33)]), backend)
        assert not fused.applies(model, h.double(), causal, backend)


def test_narrow_heads_keep_the_eager_layers(tiny_llama_dir, count_fused):
    with LLM(str(tiny_llama_dir), max_model_len=128) as llm:  # head_dim 16
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))
    assert count_fused == []


def test_speculation_stays_exact_with_fused_steps(wide_heads_dir, count_fused, monkeypatch):
    prompts = [[5, 9, 13, 2, 7], [11, 3, 3, 8, 1, 4, 20, 6]]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(str(wide_heads_dir), draft=str(wide_heads_dir), max_model_len=128) as llm:
        monkeypatch.setattr(fused, "ENABLED", False)
        llm.speculation = SpeculationConfig(mode="ar")
        expected = [llm.generate([ids], greedy)[0].token_ids for ids in prompts]
        assert count_fused == []
        monkeypatch.setattr(fused, "ENABLED", True)
        for mode in ("ar", "sd"):  # one sequence at a time: the steps fused.py takes (a batch's are eager)
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            assert [llm.generate([ids], greedy)[0].token_ids for ids in prompts] == expected, mode
        assert 1 in count_fused and 5 in count_fused  # decode steps and k + 1 = 5-row verifies


def test_a_torch_build_that_rounds_rotary_otherwise_keeps_the_eager_layers(wide_heads_dir, count_fused,
                                                                            monkeypatch):
    assert fused.rotary_matches()  # this build: the product, then one FMA
    monkeypatch.setattr(fused, "rotary_matches", lambda: False)
    with LLM(str(wide_heads_dir), max_model_len=128) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))
    assert count_fused == []


def test_a_reallocated_cache_gets_new_plans(wide_heads_dir):
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        layers = fused.FusedLayers(runner.model, runner.backend)
        first = layers.plan(1)
        assert first is not None and layers.plan(1) is first
        assert first[0].k_cache == runner.backend.k[0].data_ptr()
        k = runner.backend.k[0]
        runner.backend.allocate(num_layers=len(runner.backend.k), num_slots=k.shape[1], num_kv_heads=k.shape[0],
                                head_dim=k.shape[2], dtype=k.dtype, device=k.device)
        again = layers.plan(1)
        assert again is not first and again[0].k_cache == runner.backend.k[0].data_ptr()


def test_a_layer_whose_down_product_runs_elsewhere_keeps_every_back_half_in_python(wide_heads_dir, count_fused,
                                                                                   monkeypatch):
    """Whole layers everywhere or nowhere: one layer's down product off the panels leaves every layer's silu and
    down product to Python, with the eager logits still."""
    original = fused._weight
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        last = runner.model.model.layers[-1].mlp.down_proj
        monkeypatch.setattr(fused, "_weight", lambda module, *a: None if module is last else original(module, *a))
        ids = torch.randint(runner.model.args.vocab_size, (45,), generator=torch.Generator().manual_seed(5)).tolist()
        runner.run_spans(ids[:40], torch.arange(40), slice(0, 40), [SeqSpan(0, 40, slice(0, 40), 40)],
                         all_logits=False)
        monkeypatch.setattr(fused, "ENABLED", False)
        eager = step_logits(runner, ids, 40, 5)
        monkeypatch.setattr(fused, "ENABLED", True)
        assert torch.equal(step_logits(runner, ids, 40, 5), eager)
        plan = runner.model._fused.plan(5)
        assert count_fused == [5] and all(layer.down.a is None for layer in plan)
        assert not fused.whole(plan, 5, 1)


def test_whole_layers_take_one_thread_or_fewer_values_than_torchs_split(wide_heads_dir):
    """Where F.silu would split its values over threads (at points that need not fall on its vector runs) the
    back halves stay in Python."""
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        plan = fused.FusedLayers(llm.core.runner.model, llm.core.runner.backend).plan(1)
        rows = -(-fused.GRAIN // plan[0].down.k)  # the fewest rows of GRAIN values or more
        assert fused.whole(plan, rows, 1) and fused.whole(plan, rows - 1, 2)
        assert not fused.whole(plan, rows, 2)
