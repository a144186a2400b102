"""attention.cpp's scores in passes of several keys (AVX-512: 16 keys reduced at once; AVX2 and NEON: 4 keys a pass
at head size 64, 2 at 128) give each key the bits of the one-key code (`dot`): the kernel built as it ships is
compared with a build whose every key goes through `dot` (ATTN_ONE_KEY_SCORES), for each instruction set this CPU
runs. test_isa.py compares the builds with each other; this checks the passes on any CPU alone (on one without
AVX-512 or the cross tools, nothing else would see a pass that sums a key in another order)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from engine.layers import native

KERNELS = Path(native.__file__).resolve().parent.parent / "kernels"


def _build(isa: str, directory: Path, *defines: str) -> ctypes.CDLL:
    """attention.cpp alone, for `isa`, single-threaded (no OpenMP: threads.h runs the work in one range)."""
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = directory / f"attention-{isa}{'-'.join(('', *defines))}.so"
    built = subprocess.run([compiler, *native.FLAGS, *native.ISA_FLAGS[isa], *(f"-D{d}" for d in defines),
                            str(KERNELS / "attention.cpp"), "-o", str(out)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    lib = ctypes.CDLL(str(out))
    for name in ("causal_attention", "causal_attention_half"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = native.CAUSAL_ATTENTION_ARGS, None
    return lib


@pytest.fixture(scope="module", params=native.cpu_isas() or ["none"])
def builds(request, tmp_path_factory) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(the kernel as it ships, every key through dot) for one instruction set this CPU runs."""
    if request.param == "none":
        pytest.skip("no instruction set the kernels build for")
    directory = tmp_path_factory.mktemp(f"scores-{request.param}")
    return _build(request.param, directory), _build(request.param, directory, "ATTN_ONE_KEY_SCORES")


def _attend(lib: ctypes.CDLL, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: int, half: bool) -> torch.Tensor:
    n, heads, d = q.shape
    out = torch.full((n, heads * d), float("nan"))
    cache = (k.half(), v.half()) if half else (k, v)
    fn = lib.causal_attention_half if half else lib.causal_attention
    fn(q.data_ptr(), n, heads, d, cache[0].data_ptr(), cache[1].data_ptr(), k.shape[0], k.shape[1], 3, keys,
       d**-0.5, out.data_ptr(), 1)
    return out


@pytest.mark.parametrize("head_dim", [64, 128, 48])
@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
def test_the_passes_give_each_key_the_one_key_bits(builds, head_dim, half):
    """Key counts around every pass's edges (1-4 and 16-key passes, their tails), rows 1-17, 1-3 query heads a KV
    head; scores of both signs and sizes (keys scaled up: the softmax's weights are not all alike)."""
    shipped, one_key = builds
    g = torch.Generator().manual_seed(head_dim)
    for keys in (1, 2, 3, 4, 5, 7, 15, 16, 17, 33, 66, 130, 301):
        for n, group in ((1, 3), (5, 1), (17, 2)):
            if n > keys:
                continue
            kv_heads = 2
            q = torch.randn(n, group * kv_heads, head_dim, generator=g)
            k = torch.randn(kv_heads, keys + 8, head_dim, generator=g) * 3
            v = torch.randn(kv_heads, keys + 8, head_dim, generator=g)
            a, b = (_attend(lib, q, k, v, keys, half) for lib in (shipped, one_key))
            assert not a.isnan().any()
            assert torch.equal(a, b), f"{keys} keys, {n} rows, {group} heads a KV head: {(a - b).abs().max()}"
