"""Time a model's matmuls (every layer's and the head's) by row count for each CPU kernel: the table behind the
engine's choice of few-row kernel (engine/layers/packed.py, engine/layers/panel.py).

    python scripts/matmul_rows.py [--target smollm2-135m] [--threads 1] [--rows 1,2,5,8,16,32] [--repeats 5]

Random weights of the target's shapes (from its config.json), K-major as the engine stores them; prints ms per
step (all the matmuls of one forward) for the plain K-major GEMM and each packed kernel that runs here, the best
of --repeats.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import packed
from engine.registry import resolve_model


def shapes(config: dict) -> list[tuple[int, int]]:
    """[N, K] of every matmul of one forward: per layer QKV, O, gate-up, down; then the head."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
    per_layer = [(qkv, hidden), (hidden, config["num_attention_heads"] * head_dim), (2 * inter, hidden),
                 (hidden, inter)]
    return per_layer * config["num_hidden_layers"] + [(config["vocab_size"], hidden)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,2,5,8,16,32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    config = json.loads((resolve_model(args.target) / "config.json").read_text())
    generator = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, k, generator=generator) * 0.02).t().contiguous().t() for n, k in shapes(config)]
    kernels = [k for k in packed.KERNELS if packed.available(k)]
    modules: dict[str, list[nn.Module]] = {}
    for kernel in kernels:
        modules[kernel] = []
        for w in weights:
            m = nn.Module()
            m.weight, m.packed, m.low_bits, m.packed_kernel = w, packed.pack(w, kernel), None, kernel
            m.packed_min_rows, m.packed_rows = 1, 1 << 40
            modules[kernel].append(m)
    print(f"{args.target}: {len(weights)} matmuls, {sum(w.numel() for w in weights) * 4 / 1e6:.0f} MB float32, "
          f"{args.threads} thread(s); ms per step")
    print("rows  " + "  ".join(f"{name:>8}" for name in ("plain", *kernels)))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=generator) for k in {w.shape[1] for w in weights}}
        steps = {"plain": lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights]}
        for kernel in kernels:
            steps[kernel] = lambda ms=modules[kernel], xs=xs: [packed.linear(xs[m.weight.shape[1]], m) for m in ms]
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
