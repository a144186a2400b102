"""Time a model's matmuls (every layer's and the head's) by row count for each CPU kernel: the table behind the
engine's choice of few-row kernel (engine/layers/packed_kernels.py, engine/layers/panel.py).

    python scripts/matmul_rows.py [--target smollm2-135m] [--threads 1] [--rows 1,2,5,8,16,32] [--repeats 5]

The target's own weights (loaded by the engine, K-major as it stores them, every bias-free matmul: each layer's
and the head); prints ms per step (all those matmuls once) for the plain K-major GEMM and each packed kernel
that runs here, the best of --repeats; with the 4-bit panels also "p4-inline" (each weight rebuilt in every pass of a
few rows) and "p4-once" (each panel rebuilt once into float32, then the float32 kernel's passes), whose choice by
row count "panel4" takes (engine/kernels/panel_gemm.cpp: LOW_BIT_REBUILD_ROWS).
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.nn.functional as F

from engine import LLM
from engine.layers import native, packed, packed_kernels

REBUILT = {"p4-inline": 1 << 40, "p4-once": 1}  # panel4, its weights rebuilt from these rows on (default: "panel4")


def rebuilt_from(rows: int, step):
    """step() with the 4-bit kernels rebuilding each panel once into float32 from `rows` rows on."""
    lib = native.library()
    lib.low_bit_rebuild_rows(rows)
    try:
        return step()
    finally:
        lib.low_bit_rebuild_rows(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,2,5,8,16,32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    with LLM(target=args.target, threads=args.threads, packed_weights=False) as llm:
        shared = {id(m.weight): m.weight for m in packed.bias_free_matmuls(llm.core.runner.model)}
    weights = list(shared.values())  # a tied head shares the embedding's weight: counted once
    generator = torch.Generator().manual_seed(0)
    kernels = [k for k in packed_kernels.KERNELS if packed_kernels.available(k)]
    modules = {kernel: [packed.standin(w, packed.pack(w, kernel), kernel, rows=(1, packed_kernels.EVERY_STEP))
                        for w in weights] for kernel in kernels}
    print(f"{args.target}: {len(weights)} matmuls, {sum(w.numel() for w in weights) * 4 / 1e6:.0f} MB float32, "
          f"{args.threads} thread(s); ms per step")
    extra = list(REBUILT) if "panel4" in kernels else []
    print("rows  " + "  ".join(f"{name:>8}" for name in ("plain", *kernels, *extra)))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=generator) for k in {w.shape[1] for w in weights}}
        steps = {"plain": lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights]}
        for kernel in kernels:
            steps[kernel] = lambda ms=modules[kernel], xs=xs: [packed.linear(xs[m.weight.shape[1]], m) for m in ms]
        if "panel4" in kernels:  # its weights rebuilt in every pass of rows / once a panel at any row count
            for name, rows_from in REBUILT.items():
                steps[name] = lambda r=rows_from, step=steps["panel4"]: rebuilt_from(r, step)
        best = {}
        for name, step in steps.items():
            step()  # warm-up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            best[name] = min(times) * 1e3
        print(f"{rows:>4}  " + "  ".join(f"{best[name]:8.1f}" for name in steps))


if __name__ == "__main__":
    main()
