"""The CPU kernels built for AVX2 (engine/kernels/simd.h's two 8-lane halves) and for AArch64's NEON (four 4-lane
quarters: cross-compiled, run under qemu, tests/engine/cross.py) compute the AVX-512 build's bits, kernel by
kernel, and the x86 builds in a whole model's decode and verify steps too (how the builds are chosen and made:
test_kernel_build.py)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.layers import native, panel, panel4, panel8
from tests.engine import cross
from tests.engine.cross import call
from tests.engine.test_fused import step_logits
from tests.engine.test_panel4 import q4_form
from tests.engine.test_panel8 import q8_form

X86 = ("avx512", "avx2")


def _x86_isas() -> list[str]:
    """The x86 instruction sets this CPU runs (none on AArch64)."""
    return [isa for isa in native.cpu_isas() if isa in X86]


def _x86_builds() -> dict[str, object]:
    return {isa: lib for isa in _x86_isas() if (lib := native.build(isa)) is not None}


OTHERS = ("avx2", "neon", "neon-clang")  # compared with the best x86 build, each where it builds here


@pytest.fixture(scope="module")
def reference():
    """(name, library): the best x86 build this CPU runs, the one the others must match."""
    if not (builds := _x86_builds()):
        pytest.skip("compares the builds with an x86 one: none here")
    return next(iter(builds.items()))


@pytest.fixture(scope="module", params=OTHERS)
def libs(request, reference):
    """The reference build and one other: AVX2; NEON under qemu where the cross tools are (g++'s with OpenMP;
    clang's without, as Apple's clang builds it)."""
    name = request.param
    if name == reference[0]:
        pytest.skip(f"{name} is the reference build on this CPU")
    lib = {"avx2": lambda: _x86_builds().get("avx2"), "neon": cross.library,
           "neon-clang": lambda: cross.library(compiler="clang++")}[name]()
    if lib is None:
        pytest.skip(f"no {name} build here (NEON: apt-get install g++-aarch64-linux-gnu qemu-user clang)")
    return dict([reference, (name, lib)])


def _each(libs, run) -> list[torch.Tensor]:
    """run(lib) -> output, for each build; the reference build's output first."""
    return [run(lib) for lib in libs.values()]


def _equal(outputs: list[torch.Tensor]) -> bool:
    return all(torch.equal(outputs[0], out) for out in outputs[1:])


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 8, 9, 13])
def test_gemms_give_the_same_bits(libs, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(100, 96, generator=g)  # 100 outputs: a short last panel
    panels = panel.to_panels(w)

    def fp32(lib):
        y = torch.empty(rows, 100)
        call(lib, "panel_gemm", x, rows, 96, panels, y, 100, 2)
        return y

    four, eight = panel4.compress(q4_form(torch.randn(64, 96, generator=g))), panel8.compress(q8_form(w[:96]))
    assert four is not None and eight is not None

    def q4(lib):
        y = torch.empty(rows, 64)
        call(lib, "panel4_gemm", x, rows, 96, *four.operands, y, 64, 2)
        return y

    def q8(lib):
        y = torch.empty(rows, 96)
        call(lib, "panel8_gemm", x, rows, 96, *eight.operands, y, 96, 2)
        return y

    for run, reference in ((fp32, x @ w.t()), (q4, None), (q8, None)):
        outputs = _each(libs, run)
        assert _equal(outputs), run.__name__
        if reference is not None:
            assert torch.allclose(outputs[0], reference, atol=1e-4)


@pytest.mark.parametrize("width", [576, 100])
def test_rms_norm_gives_the_same_bits(libs, width):
    g = torch.Generator().manual_seed(width)
    x, w = torch.randn(5, width, generator=g) * 4, torch.randn(width, generator=g)

    def norm(lib):
        y = torch.empty_like(x)
        call(lib, "rms_norm", x, 5, width, w, 1e-5, y)
        return y

    outputs = _each(libs, norm)
    assert _equal(outputs)
    assert torch.allclose(outputs[0], x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, atol=1e-5)


@pytest.mark.parametrize(("head_dim", "keys", "group"),
                         [(64, 37, 3), (64, 300, 2), (64, 40, 5), (64, 33, 1), (64, 50, 4), (48, 21, 2), (40, 23, 2),
                          (128, 16, 3), (128, 70, 2), (128, 40, 1)])
@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
def test_attention_gives_the_same_bits(libs, head_dim, keys, group, half):
    """Every path of attention.cpp: 16-wide exp and libm's tail, head sizes 64 and 128 (AVX-512: 16 keys' dot
    products reduced at once; AVX2 and NEON: 4 keys a pass at 64, 2 at 128, the last few one at a time) and any other
    (48; 40: a masked tail), 1-5 query heads a KV head (a pass: 1-4); over a half cache (its tiles converted:
    simd.h's v_load_half), the float32 kernel's bits on the converted values."""
    g = torch.Generator().manual_seed(keys)
    n, kv_heads, slots = 5, 2, 400
    heads = group * kv_heads
    q = torch.randn(n, heads, head_dim, generator=g)
    k, v = torch.randn(kv_heads, slots, head_dim, generator=g) * 2, torch.randn(kv_heads, slots, head_dim, generator=g)
    if half:
        k, v = k.half().float(), v.half().float()  # (the values a half cache holds)

    def attend(lib, name="causal_attention_half" if half else "causal_attention"):
        out = torch.empty(n, heads * head_dim)
        cache = (k.half(), v.half()) if name.endswith("_half") else (k, v)
        call(lib, name, q, n, heads, head_dim, *cache, kv_heads, slots, 3, keys, head_dim**-0.5, out, 2)
        return out

    outputs = _each(libs, attend)
    assert _equal(outputs)
    if half:
        assert torch.equal(outputs[0], attend(next(iter(libs.values())), "causal_attention"))
    keys_of = k[:, 3 : 3 + keys].repeat_interleave(group, 0)  # [heads, keys, D]
    values_of = v[:, 3 : 3 + keys].repeat_interleave(group, 0)
    mask = torch.ones(n, keys, dtype=torch.bool).tril(keys - n)
    expected = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), keys_of, values_of, mask)
    assert torch.allclose(outputs[0], expected.transpose(0, 1).reshape(n, -1), atol=1e-5)


def test_rotary_gives_the_same_bits(libs):
    g = torch.Generator().manual_seed(3)
    x, cos, sin = torch.randn(5, 3, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)

    def rotary(lib):
        out = torch.empty_like(x)
        call(lib, "rotary_rows", x, 5, 3, 64, 3 * 64, cos, sin, out, 3 * 64)
        return out

    assert _equal(_each(libs, rotary))


@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
def test_a_fused_layer_front_gives_the_same_bits(libs, half):
    """layer.cpp's layer_front on a layer with every weight kind (4-bit qkv, 8-bit o, float32 gate/up panels):
    the residual stream, the gate/up products and the keys and values it writes into the cache (float32, or half:
    simd.h's v_store_half)."""
    g = torch.Generator().manual_seed(9)
    n, dm, heads, kv_heads, d, inter, slots = 5, 64, 2, 1, 64, 128, 32
    width = (heads + 2 * kv_heads) * d
    qkv = panel4.compress(q4_form(torch.randn(width, dm, generator=g) * 0.2))
    o = panel8.compress(q8_form(torch.randn(dm, heads * d, generator=g) * 0.2))
    gate_up_weight = torch.randn(2 * inter, dm, generator=g) * 0.2
    assert qkv is not None and o is not None
    weights = [(4, width, dm, *qkv.operands), (8, dm, heads * d, *o.operands, None),
               (0, 2 * inter, dm, panel.to_panels(gate_up_weight), None, None)]
    norm1, norm2 = torch.rand(dm, generator=g) + 0.5, torch.rand(dm, generator=g) + 0.5
    x, residual0 = torch.randn(n, dm, generator=g), torch.randn(n, dm, generator=g)
    keys0, values0 = torch.randn(kv_heads, slots, d, generator=g), torch.randn(kv_heads, slots, d, generator=g)
    if half:
        keys0, values0 = keys0.half(), values0.half()
    angles = torch.randn(n, d // 2, generator=g)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([-angles.sin(), angles.sin()], -1)

    def front(lib):
        residual, keys, values = residual0.clone(), keys0.clone(), values0.clone()
        gate_up = torch.empty(n, 2 * inter)
        layer = cross.Struct(*[f for w in weights for f in w], norm1, norm2, 1e-5, keys, values, *NO_DOWN, int(half))
        status = call(lib, "layer_front", layer, n, x, residual, 1, dm, heads, kv_heads, d, cos, sin, slots, 7, 0,
                      12, d**-0.5, gate_up, 2)
        assert status in (0, None)  # None: the NEON driver exits non-zero on an error
        return torch.cat([residual.flatten(), gate_up.flatten(), keys.float().flatten(), values.float().flatten()])

    outputs = _each(libs, front)
    assert _equal(outputs)
    assert not torch.equal(outputs[0][-2 * slots * d :], torch.cat([keys0.flatten(), values0.flatten()]).float())


NO_DOWN = (0, 0, 0, None, None, None)  # a Layer's down Weight, which layer_front does not read


def test_silu_mul_gives_the_same_bits(libs):
    """layer.cpp's silu_mul over exp's whole range and its edges (-104 and 100: 0 and inf; zeros, tiny values)."""
    g = torch.Generator().manual_seed(5)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-40, 88.7, -88.7, 103.9, -103.9, 104.1, -104.1, 100.1, -100.1,
                          float("inf"), 3.0, -3.0])  # not -inf: its silu is a NaN, of other bits on ARM
    gate = torch.cat([torch.randn(3 * 160 - edges.numel(), generator=g) * 40, edges]).reshape(3, 160)
    gate_up = torch.cat([gate, torch.randn(3, 160, generator=g)], dim=1)  # [3, 2 I]

    def silu(lib):
        out = torch.empty(3, 160)
        call(lib, "silu_mul", gate_up, 3, 160, out)
        return out

    outputs = _each(libs, silu)
    assert _equal(outputs)
    assert torch.equal(outputs[0], torch.nn.functional.silu(gate_up[:, :160]) * gate_up[:, 160:])


def _layer_fields(g, dm, heads, kv_heads, d, inter, slots, kinds, half=False):
    """cross.Struct fields of one layer.cpp Layer (each product's panels in the kind given: 0, 4 or 8) and its
    cache tensors (half ones where `half`)."""
    width = (heads + 2 * kv_heads) * d

    def weight(kind, n, k):
        w = torch.randn(n, k, generator=g) * 0.2
        if kind == 4:
            return (4, n, k, *panel4.compress(q4_form(w)).operands)
        if kind == 8:
            return (8, n, k, *panel8.compress(q8_form(w)).operands, None)
        return (0, n, k, panel.to_panels(w), None, None)

    qkv, o, gate_up, down = (weight(kind, n, k) for kind, (n, k) in
                             zip(kinds, [(width, dm), (dm, heads * d), (2 * inter, dm), (dm, inter)], strict=True))
    norms = torch.rand(dm, generator=g) + 0.5, torch.rand(dm, generator=g) + 0.5
    keys, values = torch.randn(kv_heads, slots, d, generator=g), torch.randn(kv_heads, slots, d, generator=g)
    if half:
        keys, values = keys.half(), values.half()
    return [*qkv, *o, *gate_up, *norms, 1e-5, keys, values, *down, int(half)], (keys, values)


@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
def test_decoder_layers_give_the_same_bits(libs, half):
    """layer.cpp's decoder_layers over two layers (every weight kind among their products): the last MLP output,
    the residual stream and the keys and values written into both layers' caches."""
    g = torch.Generator().manual_seed(11)
    n, dm, heads, kv_heads, d, inter, slots = 5, 64, 2, 1, 64, 128, 32
    first, caches0 = _layer_fields(g, dm, heads, kv_heads, d, inter, slots, (4, 8, 0, 4), half)
    second, caches1 = _layer_fields(g, dm, heads, kv_heads, d, inter, slots, (0, 4, 4, 8), half)
    x = torch.randn(n, dm, generator=g)
    angles = torch.randn(n, d // 2, generator=g)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([-angles.sin(), angles.sin()], -1)

    def layers(lib):
        caches = [t.clone() for t in (*caches0, *caches1)]
        fields = first[:-9] + caches[:2] + first[-7:] + second[:-9] + caches[2:] + second[-7:]  # fresh caches
        out, residual = torch.empty(n, dm), torch.empty(n, dm)
        status = call(lib, "decoder_layers", cross.Struct(*fields), 2, n, x, residual, out, dm, heads, kv_heads, d,
                      cos, sin, slots, 7, 0, 12, d**-0.5, 2)
        assert status in (0, None)  # None: the NEON driver exits non-zero on an error
        return torch.cat([out.flatten(), residual.flatten(), *(c.float().flatten() for c in caches)])

    outputs = _each(libs, layers)
    assert _equal(outputs)
    assert outputs[0][: n * dm].abs().sum() > 0


def test_a_models_steps_give_the_same_logits(wide_heads_dir, monkeypatch):
    """Prefill, a 5-row verify and a one-row decode step (the fused layers) of a tiny model, per x86 build."""
    if len(builds := _x86_builds()) < 2:
        pytest.skip("compares the AVX-512 and AVX2 builds: needs a CPU with both")
    logits = {}
    try:
        for isa in builds:
            monkeypatch.setenv(native.ISA_ENV, isa)
            native.forget()
            assert native.isa() == isa and panel.available()
            with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
                runner = llm.core.runner
                ids = torch.randint(runner.model.args.vocab_size, (46,), generator=torch.Generator().manual_seed(4))
                ids = ids.tolist()
                logits[isa] = (step_logits(runner, ids, 0, 40), step_logits(runner, ids, 40, 5),
                               step_logits(runner, ids, 45, 1))
    finally:
        monkeypatch.delenv(native.ISA_ENV)
        native.forget()
    for a, b in zip(logits["avx512"], logits["avx2"], strict=True):
        assert torch.equal(a, b)
