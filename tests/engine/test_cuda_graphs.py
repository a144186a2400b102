"""The CUDA fast paths' CPU-testable parts: graph buckets and padding (through the eager twin of a CUDA graph),
the backend choice, and that the switches reach the runner. The CUDA runs themselves are in test_gpu.py."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import SdpaBackend, choose_backend
from engine.attention.base import SeqSpan
from engine.build import fast_kwargs
from engine.config import EngineConfig, FastPath, SpeculationConfig
from engine.cuda_graphs import (
    DEFAULT_MAX_BATCH,
    VERIFY_MAX_BATCH,
    VERIFY_ROWS,
    bucket_for,
    graph_buckets,
    graph_shapes,
    key_buckets,
    shape_for,
    use_cuda_graphs,
)
from engine.errors import InvalidParameterError
from engine.runner import ModelRunner
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_buckets_cover_every_batch_size_up_to_the_largest():
    assert graph_buckets(64) == (1, 2, 4, 8, 16, 32, 48, 64)
    assert graph_buckets(5) == (1, 2, 4, 5)
    assert graph_buckets(1) == (1,)
    buckets = graph_buckets(40)
    for n in range(1, 41):
        b = bucket_for(n, buckets)
        assert b >= n and all(not (n <= smaller < b) for smaller in buckets)
    assert bucket_for(41, buckets) is None  # too large: the runner runs it eagerly
    with pytest.raises(ValueError):
        graph_buckets(0)


def test_shapes_cover_decode_batches_and_small_verify_batches():
    shapes = graph_shapes(64)
    assert {b for b, q in shapes if q == 1} == set(graph_buckets(64))
    assert {q for _, q in shapes} == {1, *VERIFY_ROWS}
    assert max(b for b, q in shapes if q > 1) == VERIFY_MAX_BATCH
    assert shape_for(3, 1, shapes) == (4, 1)
    assert shape_for(3, 4, shapes) == (4, 5)    # k = 3: padded to 5 rows
    assert shape_for(1, 5, shapes) == (1, 5)
    assert shape_for(17, 2, shapes) is None      # more sequences than a verify graph holds: eager
    assert shape_for(1, max(VERIFY_ROWS) + 1, shapes) is None  # a prefill chunk: eager
    assert shape_for(2, 2, graph_shapes(1)) is None


def test_key_buckets_double_up_to_the_longest():
    assert key_buckets(2048) == (256, 512, 1024, 2048)
    assert key_buckets(3000) == (256, 512, 1024, 2048, 3000)
    assert key_buckets(100) == (100,)
    assert key_buckets(128, smallest=16) == (16, 32, 64, 128)
    with pytest.raises(ValueError):
        key_buckets(0)


def test_graphs_only_on_cuda_and_never_with_eager_or_tp():
    assert not use_cuda_graphs("cpu", eager=False, tp=1)
    assert not use_cuda_graphs("cuda:0", eager=True, tp=1)
    assert not use_cuda_graphs("cuda:0", eager=False, tp=2)
    assert use_cuda_graphs("cuda:0", eager=False, tp=1)


def test_fast_kwargs_plumb_eager_and_compile_on_cuda_and_only_compile_on_cpu():
    assert fast_kwargs(FastPath(eager=True, compile=True), torch.device("cpu"), tp=1, max_keys=64) == {
        "compile_decode": True, "compile_rows": False}  # test_compiled_decode.py
    cuda = torch.device("cuda", 0)
    assert fast_kwargs(FastPath(), cuda, tp=1, max_keys=64) == dict(
        graph_batch=DEFAULT_MAX_BATCH, graph_max_keys=64, compile_model=False)
    assert fast_kwargs(FastPath(eager=True, compile=True), cuda, tp=1, max_keys=64)["graph_batch"] == 0
    assert fast_kwargs(FastPath(compile=True), cuda, tp=1, max_keys=64)["compile_model"] is True
    assert fast_kwargs(FastPath(attention="sdpa"), cuda, tp=1, max_keys=64)["graph_batch"] == 8


def test_backend_choice():
    bf16 = torch.bfloat16
    assert choose_backend("auto", "cpu", torch.float32, has_flashinfer=True) == "sdpa"
    assert choose_backend("auto", "cuda:0", bf16, has_flashinfer=True) == "flashinfer"
    assert choose_backend("auto", "cuda:0", bf16, has_flashinfer=False) == "sdpa"
    assert choose_backend("auto", "cuda:0", torch.float32, has_flashinfer=True) == "sdpa"
    assert choose_backend("sdpa", "cuda:0", bf16, has_flashinfer=True) == "sdpa"
    assert choose_backend("flashinfer", "cuda:0", bf16, has_flashinfer=True) == "flashinfer"
    for device, dtype, installed in (("cpu", bf16, True), ("cuda:0", bf16, False), ("cuda:0", torch.float32, True)):
        with pytest.raises(InvalidParameterError):
            choose_backend("flashinfer", device, dtype, has_flashinfer=installed)
    with pytest.raises(InvalidParameterError):
        choose_backend("xformers", "cpu", torch.float32)


def test_flashinfer_on_the_cpu_is_refused_up_front_in_one_line():
    with pytest.raises(InvalidParameterError) as err:
        EngineConfig(attention="flashinfer")
    assert "use --attention sdpa" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InvalidParameterError):
        EngineConfig(attention="tensorrt")
    assert EngineConfig(eager=True, compile=True, packed_kernel="mkl").fast_path == FastPath(
        "auto", True, True, packed_kernel="mkl")
    # compiled steps keep the packed copies only for the panel kernel, which they call as an op
    assert EngineConfig(compile=True, packed_kernel="panel").fast_path.packed
    assert not EngineConfig(compile=True, draft="d", packed_kernel="mkl").fast_path.packed
    assert EngineConfig(draft="d", packed_kernel="mkl").fast_path.packed


def test_the_cpu_never_uses_graphs(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), max_model_len=128, eager=False) as llm:
        assert llm.core.runner.graphs is None
        assert isinstance(llm.core.runner.backend, SdpaBackend)


def _graph_runner(runner: ModelRunner, max_batch: int, min_keys: int = 256) -> ModelRunner:
    """A runner over the same model whose decode steps replay the eager twin of CUDA graphs (keys up to 128)."""
    bs = runner.block_size
    num_slots = runner.backend.k[0].shape[1]
    return ModelRunner(runner.model, SdpaBackend(), num_blocks=runner.first_extra_slot // bs, block_size=bs,
                       device=runner.device, dtype=runner.backend.k[0].dtype,
                       extra_slots=num_slots - runner.first_extra_slot, graph_batch=max_batch, graph_max_keys=128,
                       graph_min_keys=min_keys)


@pytest.fixture(scope="module")
def pair(tiny_llama_dir, tmp_path_factory):
    draft = noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("graphs") / "draft", scale=0.1, seed=3)
    # no prefix caching: the graph runners have KV caches of their own
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=128, block_size=4,
             enable_prefix_caching=False) as llm:
        yield llm


def test_a_captured_step_of_mixed_row_counts_matches_the_eager_forward(pair):
    """Sequences with 4, 1 and 2 causal rows (padded to 5 rows, 4 sequences), key lists as a slice and as scattered
    slots: the replay's hidden states are the eager forward's, row for row; masks, unordered spans, too many rows
    or keys run eagerly."""
    runner = _graph_runner(pair.core.runner, 4)
    graphs, vocab = runner.graphs, runner.model.args.vocab_size
    ids = torch.randint(vocab, (50,), generator=torch.Generator().manual_seed(0)).tolist()
    runner.run_spans(ids, torch.arange(50), slice(0, 50), [SeqSpan(0, 50, slice(0, 50), 50)], all_logits=False)
    scattered = torch.tensor([30, 31, 40, 41, 42])
    spans = [SeqSpan(0, 4, slice(0, 10), 10), SeqSpan(4, 1, slice(20, 26), 6), SeqSpan(5, 2, scattered, 5)]
    step = dict(ids=ids[:7], positions=torch.tensor([6, 7, 8, 9, 5, 3, 4]), write_slots=[6, 7, 8, 9, 25, 41, 42],
                spans=spans)
    assert graphs.handles(spans)
    runner.graphs = None
    want = runner.run_spans(**step, all_logits=True)  # [7, V]
    runner.graphs = graphs
    got = runner.run_spans(**step, all_logits=True)
    assert graphs.num_replays == {5: 1}
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert not graphs.handles([SeqSpan(0, 2, slice(0, 4), 4, mask=torch.ones(2, 4, dtype=torch.bool))])
    assert not graphs.handles([spans[1], spans[0]])  # rows out of order
    assert not graphs.handles([SeqSpan(0, 10, slice(0, 10), 10)])  # more rows than any verify graph
    assert graphs.handles([SeqSpan(0, 5, slice(0, 128), 128)])
    assert not graphs.handles([SeqSpan(0, 4, slice(0, 128), 128)])  # with its padding row, over max_keys (128)


def test_a_step_replays_the_shortest_key_length_that_holds_its_keys(pair):
    """SDPA's graphs in key lengths 16, 32, 64, 128: each step replays the shortest one that holds its keys and
    its padding rows' pad keys, with the eager forward's hidden states."""
    runner = _graph_runner(pair.core.runner, 2, min_keys=16)
    graphs, vocab = runner.graphs, runner.model.args.vocab_size
    assert graphs.key_lengths == (16, 32, 64, 128)
    assert {s[2] for s in graphs.replays} == {16, 32, 64, 128}
    ids = torch.randint(vocab, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    runner.run_spans(ids, torch.arange(120), slice(0, 120), [SeqSpan(0, 120, slice(0, 120), 120)], all_logits=False)
    for num_keys, q_len, want_keys in ((16, 1, 16), (17, 1, 32), (16, 2, 16), (15, 4, 16), (16, 4, 32),
                                       (60, 4, 64), (100, 1, 128)):  # 4 rows (k = 3) run padded to 5: a pad key
        step = dict(ids=ids[num_keys - q_len: num_keys], positions=torch.arange(num_keys - q_len, num_keys),
                    write_slots=slice(num_keys - q_len, num_keys), spans=[SeqSpan(0, q_len, slice(0, num_keys),
                                                                                  num_keys)])
        runner.graphs = None
        want = runner.run_spans(**step, all_logits=True)  # [q, V]
        runner.graphs = graphs
        before = dict(graphs.num_key_replays)
        got = runner.run_spans(**step, all_logits=True)
        assert graphs.num_key_replays.get(want_keys, 0) == before.get(want_keys, 0) + 1, (num_keys, q_len)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert not graphs.handles([SeqSpan(0, 1, slice(0, 129), 129)])  # past the longest: eager


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_graph_twin_gives_the_eager_greedy_output(pair, mode):
    """Padded shapes (3 prompts -> 4 sequences; k + 1 rows -> 2, 3 or 5; SSD's branch and glue steps), static
    buffers and replays: same tokens as eager, and the verification really ran on several-row graphs."""
    pair.speculation = SpeculationConfig(mode=mode, k=3)
    want = [o.token_ids for o in pair.generate(PROMPTS[:3], GREEDY)]
    core = pair.core
    eager_target, eager_draft = core.runner, core.drafter.runner
    core.runner, core.drafter.runner = _graph_runner(eager_target, 4), _graph_runner(eager_draft, 16)
    try:
        got = [o.token_ids for o in pair.generate(PROMPTS[:3], GREEDY)]
        target, draft = core.runner.graphs.num_replays, core.drafter.runner.graphs.num_replays
    finally:
        core.runner, core.drafter.runner = eager_target, eager_draft
    assert got == want
    assert target.get(1, 0) + draft.get(1, 0) > 0
    if mode != "ar":  # the target's k + 1 verification rows (past the one prefill of the short prompts)
        assert sum(n for rows, n in target.items() if rows > 1) > 1
    if mode == "ssd":
        assert sum(n for rows, n in draft.items() if rows > 1) > 0  # the draft's glue pass over the verified rows


def test_cli_flags_reach_the_engine(monkeypatch):
    from typer.testing import CliRunner

    from ssd_chat import cli

    seen = {}

    def fake_llm(**kwargs):
        seen.update(kwargs)
        raise InvalidParameterError("stop here")

    monkeypatch.setattr(cli, "LLM", fake_llm)
    result = CliRunner().invoke(cli.app, ["ask", "hi", "--dtype", "bfloat16", "--attention", "sdpa", "--eager",
                                          "--compile"])
    assert result.exit_code == 2
    assert (seen["dtype"], seen["attention"], seen["eager"], seen["compile"]) == ("bfloat16", "sdpa", True, True)
