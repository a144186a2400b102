"""The screened greedy head (engine.layers.greedy_head, panel8_screened): every row's argmax, ties included, is the
full 8-bit head's, its finite entries are the full head's bits, it computes few panels exactly, and an engine's
greedy tokens are the same with it and without it in AR, SD and SSD, while sampled steps keep the full head."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.layers import greedy_head, native, panel, panel8
from tests.engine import test_panel8
from tests.engine.test_panel4 import GREEDY, PROMPTS
from tests.engine.test_panel8 import q8_form

low_bit_model = test_panel8.low_bit_model  # the fixture: a tiny Llama with Q4_1 layers and a Q8_0 head
pytestmark = pytest.mark.skipif(not (panel.available() and native.q8_available()),
                                reason="needs the panel kernels and q8's code (x86 with AVX2)")


def head(n: int, k: int, seed: int) -> panel8.Panel8:
    generator = torch.Generator().manual_seed(seed)
    return panel8.compress(q8_form(torch.randn(n, k, generator=generator) * 0.05))


def check(p: panel8.Panel8, x: torch.Tensor) -> int:
    """screened(x) against the full product: the same argmax per row, the full product's bits wherever finite,
    and the non-finite entries -inf. Returns the (row, panel) pairs computed exactly."""
    full = p.matmul(x)
    y, exact = panel8.screened(p, x, panel8.bound_sums(p))
    assert torch.equal(y.argmax(-1), full.argmax(-1))
    finite = torch.isfinite(y)
    assert torch.equal(y[finite], full[finite])
    assert bool((y[~finite] == float("-inf")).all())
    assert 0 < exact <= x.shape[0] * (p.n // 32)
    return exact


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(2048, 576), (1024, 64), (512, 2048)])
def test_every_rows_argmax_is_the_full_heads(n, k, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    p, generator = head(n, k, n + k), torch.Generator().manual_seed(k)
    exact = rows_seen = 0
    for trial in range(40):
        rows = 1 + trial % 8
        x = torch.randn(rows, k, generator=generator) * (1 + 20 * torch.rand(rows, 1, generator=generator))
        if trial % 4 == 0:  # outliers: a few inputs far larger than the rest (their blocks round coarsely)
            x[:, torch.randint(k, (3,), generator=generator)] *= 60
        exact += check(p, x)
        rows_seen += rows
    assert exact / rows_seen < 0.5 * (n // 32)  # the screen leaves few panels to compute exactly


def test_a_near_tie_the_8bit_product_misorders_is_decided_exactly():
    """Two columns, in different panels, the base column plus one q step in one input each (block 0, d = 1.125
    2^-10, x = 10.49; block 1, d = 2^-10, x = 11.51): in float32 column 3 is larger (by 2.8e-4), with x rounded
    to 8 bits (10 and 12 steps of 1) column 40 is; every other column is the base less a step."""
    k, n = 64, 64
    generator = torch.Generator().manual_seed(8)
    x = torch.rand(1, k, generator=generator) * 90 + 5
    x[0, 0] = x[0, 32] = 127.0  # each block's step: 1
    x[0, 5], x[0, 40] = 10.49, 11.51
    base = torch.randint(-100, 101, (k,), generator=generator)
    base[5] = base[40] = 0
    q = base.repeat(n, 1)
    q[torch.arange(n), torch.randint(1, 32, (n,), generator=generator)] -= 1  # below the base (x > 0 there)
    q[3] = q[40] = base
    q[3, 5] += 1
    q[40, 40] += 1
    d = torch.tensor([1.125, 1.0]).repeat(n, 1) / 1024
    p = panel8.from_rows(q.to(torch.int8), d)
    full, approx = p.matmul(x), dataclasses.replace(p, q8=True).matmul(x)
    assert int(full.argmax()) == 3 and int(approx.argmax()) == 40
    check(p, x)


def test_ties_go_to_the_first_column():
    p = head(1024, 576, 3)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(3))
    best = p.matmul(x).argmax(-1)
    q = p.q.clone()  # [P, K, 32]: column c of the weight is q[c // 32, :, c % 32]
    d = p.d.clone()
    for row, twin in zip(best.tolist(), (1000, 5, 517, 31), strict=True):  # a copy of each row's best column
        q[twin // 32, :, twin % 32] = q[row // 32, :, row % 32]
        d[twin // 32, :, twin % 32] = d[row // 32, :, row % 32]
    tied = panel8.Panel8(q, d, p.n)
    full = tied.matmul(x)
    y, _ = panel8.screened(tied, x, panel8.bound_sums(tied))
    assert torch.equal(y.argmax(-1), full.argmax(-1))
    for row, twin in zip(best.tolist(), (1000, 5, 517, 31), strict=True):
        assert full[:, twin].eq(full[:, row]).any()  # the tie is there


def test_rows_without_a_bound_are_computed_whole():
    p = head(512, 64, 4)
    x = torch.randn(5, 64) * 2
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    x[3] = 0.0  # all zeros: every product 0, the first column wins
    x[4] *= 1e-38  # blocks too small for 127 / max |x| (8-bit rounding makes them zeros)
    full = p.matmul(x)
    y, exact = panel8.screened(p, x, panel8.bound_sums(p))
    assert torch.equal(torch.isnan(y[1:3]), torch.isnan(full[1:3])) and torch.equal(y[1:3].nan_to_num(),
                                                                                     full[1:3].nan_to_num())
    assert exact >= 2 * (p.n // 32)  # the NaN and inf rows, whole
    assert torch.equal(y[3:].argmax(-1), full[3:].argmax(-1))
    assert check(p, x[3:]) > 0


def test_the_avx2_code_gives_the_same_screen():
    if native.q8_support() < 2:
        pytest.skip("one q8 code here")
    p, x = head(1024, 576, 5), torch.randn(6, 576) * 4
    want = panel8.screened(p, x, panel8.bound_sums(p))
    lib = native.library()
    try:
        assert lib.q8_path(0) == 0
        got = panel8.screened(p, x, panel8.bound_sums(p))
    finally:
        lib.q8_path(-1)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_an_engine_decodes_the_same_greedy_tokens_with_and_without_the_screen(low_bit_model, tiny_llama_dir,
                                                                                 monkeypatch):
    calls = []
    screened = panel8.screened
    monkeypatch.setattr(panel8, "screened", lambda *a: calls.append(a[1].shape[0]) or screened(*a))
    outputs = {}
    llm = LLM(str(low_bit_model), draft=str(tiny_llama_dir), packed_kernel="panel4", threads=1)
    try:
        for env in ("0", "1"):
            monkeypatch.setenv(greedy_head.ENV, env)
            for mode in ("ar", "sd", "ssd"):
                llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
                before = len(calls)
                outputs[env, mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
                assert (len(calls) > before) == (env == "1"), (env, mode)
        assert max(calls) > 1  # verify steps (several rows) took it too
        before = len(calls)
        llm.speculation = SpeculationConfig(mode="sd", k=4)
        sampled = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=1)
        llm.generate(PROMPTS, sampled)
        assert len(calls) == before  # sampled steps need every logit
    finally:
        llm.close()
    assert all(out == outputs["0", "ar"] for out in outputs.values())


def test_the_bound_sums_are_made_at_load_not_in_the_first_reply(low_bit_model, monkeypatch):
    """They took 57 ms of a Zen 1's first greedy step, a quarter of the first reply's time to its first token."""
    with LLM(str(low_bit_model), packed_kernel="panel4", threads=1) as llm:
        lm_head = llm.core.runner.model.lm_head
        assert lm_head._screen[0] is lm_head.packed and lm_head._screen[1] is not None
        monkeypatch.setattr(panel8, "bound_sums", lambda packed: pytest.fail("made in a step"))
        assert llm.generate(PROMPTS[:1], GREEDY)[0].token_ids


def test_the_screen_applies_only_to_an_unsharded_float32_8bit_head(low_bit_model, monkeypatch):
    with LLM(str(low_bit_model), packed_kernel="panel4", threads=1) as llm:
        lm_head = llm.core.runner.model.lm_head
        hidden = torch.randn(2, lm_head.weight.shape[1])
        assert greedy_head.applies(lm_head, hidden)
        assert not greedy_head.applies(lm_head, hidden.double())
        monkeypatch.setenv(greedy_head.ENV, "0")
        assert not greedy_head.applies(lm_head, hidden) and greedy_head.logits(lm_head, hidden) is None
        monkeypatch.delenv(greedy_head.ENV)
        full = llm.core.runner.model.compute_logits(hidden)
        assert torch.isfinite(full).all()  # not greedy: the whole head
        screened = llm.core.runner.model.compute_logits(hidden, greedy=True)
        assert torch.equal(screened.argmax(-1), full.argmax(-1)) and not torch.isfinite(screened).all()
    with LLM(str(low_bit_model), packed_kernel="q8", threads=1) as llm:  # the head is the 8-bit product already
        assert not greedy_head.applies(llm.core.runner.model.lm_head, hidden)


def test_the_bound_holds_where_the_rounding_errors_all_add_up():
    """Activations whose 8-bit rounding errors (0.49 of a step each) all push one column's product the same way:
    the float32 product stays inside [A - E, A + E] of q8_screen8, and comes within 10% of its edge (so the bound
    is not loose by construction: a bound of 0.3 E fails here)."""
    k, generator = 576, torch.Generator().manual_seed(9)
    c = torch.rand(k // 32, 1, generator=generator) * 2 + 0.1  # each block's step dx
    n = torch.randint(-120, 121, (k // 32, 32), generator=generator).float()
    s = torch.where(torch.rand(k // 32, 32, generator=generator) < 0.5, -1.0, 1.0)
    x = c * (n + 0.49 * s)  # rounds to n: an error of 0.49 c, sign s
    x[:, 0] = 127 * c[:, 0]  # each block's largest |x|: dx = c exactly
    s[:, 0] = 1.0
    q = (127 * s).reshape(1, k).repeat(32, 1)  # one panel, 32 copies of the column that lines up with the errors
    q = torch.cat([q, torch.randint(-127, 128, (32, k), generator=generator).float()])  # and a random one
    d = (torch.rand(64, k // 32, generator=generator) * 1e-3 + 1e-4).half().float()
    d[:32] = d[0]  # the first panel's columns alike: its hi and lo are that column's A + E and A - E
    p = panel8.from_rows(q.to(torch.int8), d)
    x = x.reshape(1, k)
    hi, lo, full, sums = torch.empty(1, 2), torch.empty(1, 2), torch.zeros(1, dtype=torch.int32), panel8.bound_sums(p)
    native.library().q8_screen8(x.data_ptr(), 1, k, p.q.data_ptr(), p.d.data_ptr(), sums.data_ptr(), hi.data_ptr(),
                                lo.data_ptr(), full.data_ptr(), 64, 1)
    exact = p.matmul(x)[0, 0]
    a, e = (hi[0, 0] + lo[0, 0]) / 2, (hi[0, 0] - lo[0, 0]) / 2
    assert int(full[0]) == 0 and lo[0, 0] <= exact <= hi[0, 0]
    assert (exact - a).abs() > 0.9 * e
