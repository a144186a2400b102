"""Time the causal attention kernel (engine/kernels/attention.cpp) as a decode, verify or prefill step calls it:
one call a layer over each of the model's layers in turn, so that each layer's keys and values come from memory as
in a real step, not from the cache the last call left them in.

    python scripts/attention_calls.py [--keys 3000] [--rows 1,5,17,20,32] [--threads 1,2] [--repeats 15]

SmolLM2-135M's shape by default (30 layers, 9 heads over 3 KV heads of 64); prints the median ms per step (all the
layers' calls once) for each row count and thread count. The kernel is the one the engine builds for this CPU
(`native.library()`); to compare two versions, run this on each checkout.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.layers import native


def step_ms(lib, caches: list[tuple[torch.Tensor, torch.Tensor]], q: torch.Tensor, keys: int, threads: int,
            repeats: int, half: bool) -> float:
    """Median ms of one call per layer (q [rows, H, D] over the first `keys` slots of each layer's cache)."""
    rows, heads, d = q.shape
    out = torch.empty(rows, heads * d)
    kernel = lib.causal_attention_half if half else lib.causal_attention
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for k, v in caches:
            kernel(q.data_ptr(), rows, heads, d, k.data_ptr(), v.data_ptr(), k.shape[0], k.shape[1], 0, keys,
                   d**-0.5, out.data_ptr(), threads)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=3000)
    parser.add_argument("--rows", default="1,5,17,20,32", help="comma-separated row counts (a decode: 1)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--half", action="store_true", help="a half-precision cache (--kv-dtype float16)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    lib = native.library()
    if lib is None:
        raise SystemExit("no CPU kernels on this machine (native.library() is None)")
    dtype = torch.float16 if args.half else torch.float32
    generator = torch.Generator().manual_seed(0)
    caches = [tuple(torch.randn(args.kv_heads, args.keys, args.head_dim, generator=generator).to(dtype)
                    for _ in range(2)) for _ in range(args.layers)]
    print(f"{args.layers} layers, {args.heads} heads over {args.kv_heads} KV heads of {args.head_dim}, "
          f"{args.keys} keys, {'half' if args.half else 'float32'} cache: ms a step (median of {args.repeats})")
    thread_counts = [int(t) for t in args.threads.split(",")]
    print("rows  " + "".join(f"{f'{t} thread' + ('s' if t > 1 else ''):>12}" for t in thread_counts))
    for rows in (int(r) for r in args.rows.split(",")):
        q = torch.randn(rows, args.heads, args.head_dim, generator=generator)
        cells = [step_ms(lib, caches, q, args.keys, t, args.repeats, args.half) for t in thread_counts]
        print(f"{rows:>4}  " + "".join(f"{ms:>12.2f}" for ms in cells))


if __name__ == "__main__":
    main()
