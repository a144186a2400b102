"""Probe: what a panel kernel reading 4-bit weights would gain, and that it keeps the float32 kernel's bits.

    python scripts/q4_panel_probe.py [--rows 1,2,5,8] [--repeats 5]

SmolLM2-135M's matmul weights are Q4_1 values of the GGUF it is converted from: per 32 inputs of an output
column a float16 scale d and minimum m, and 4-bit q, dequantised as (d * q) + m in float32. The probe builds
random weights of that form in the shapes of SmolLM2-135M's 30 layers (fused QKV, o, fused gate-up, down),
checks that scripts/q4_panel_probe.cpp (which rebuilds each weight that way in registers, then runs the panel
kernel's FMA chain) gives exactly the float32 panel kernel's outputs, and times both, one thread, best of
--repeats. A measurement, not an engine path: the engine still reads the float32 weights.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from engine.layers import panel

SOURCE = Path(__file__).with_suffix(".cpp")
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K): fused QKV, o, fused gate-up, down
LAYERS = 30


def build(out_dir: Path) -> ctypes.CDLL:
    compiler = shutil.which("c++")
    assert compiler is not None, "needs a C++ compiler (c++)"
    lib_path = out_dir / "q4_panel_probe.so"
    subprocess.run([compiler, "-O3", "-mavx512f", "-mfma", "-ffp-contract=off", "-shared", "-fPIC", str(SOURCE),
                    "-o", str(lib_path)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.q4_gemm.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return lib


def make(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1 weight [n, k] -> (float32 panels, Q [n/32, k, 16] bytes, d and m [n/32, k/32, 32])."""
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    d = (torch.rand(n, k // 32) * 0.01).half().float()
    m = (-torch.rand(n, k // 32) * 0.08).half().float()
    weight = d.repeat_interleave(32, 1) * q.float() + m.repeat_interleave(32, 1)  # one rounding each, as gguf
    by_panel = q.view(n // 32, 32, k).transpose(1, 2)  # [P, k, 32]: column j's nibble low, column j + 16's high
    packed_q = (by_panel[:, :, :16] | (by_panel[:, :, 16:] << 4)).contiguous()
    per_block = [t.view(n // 32, 32, k // 32).transpose(1, 2).contiguous() for t in (d, m)]
    return panel.to_panels(weight), packed_q, *per_block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,5,8")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    assert panel.available(), "the panel kernel does not run here (AVX-512 and a C++ compiler needed)"
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        layers = [[make(n, k) for n, k in SHAPES] for _ in range(LAYERS)]

        def q4(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, n: int) -> torch.Tensor:
            y = torch.empty(x.shape[0], n)
            lib.q4_gemm(x.data_ptr(), x.shape[0], x.shape[1], q.data_ptr(), d.data_ptr(), m.data_ptr(),
                        y.data_ptr(), n)
            return y

        for rows in (int(r) for r in args.rows.split(",")):
            xs = {k: torch.randn(rows, k) for _, k in SHAPES}
            same = all(torch.equal(panel.matmul(xs[k], p, n), q4(xs[k], q, d, m, n))
                       for (n, k), (p, q, d, m) in zip(SHAPES, layers[0], strict=True))
            best = {}
            for name in ("float32", "q4"):
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    for layer in layers:
                        for (n, k), (p, q, d, m) in zip(SHAPES, layer, strict=True):
                            panel.matmul(xs[k], p, n) if name == "float32" else q4(xs[k], q, d, m, n)
                    times.append(time.perf_counter() - start)
                best[name] = min(times) * 1e3
            print(f"rows {rows}: {LAYERS} layers' matmuls, float32 panel {best['float32']:.1f} ms, "
                  f"q4 panel {best['q4']:.1f} ms ({best['float32'] / best['q4']:.2f}x), same bits: {same}")


if __name__ == "__main__":
    main()
