"""Interleaved A/B of one decode mode under several engine settings, in one process on one core: each variant's
engine is loaded once, then every repeat runs every variant over the same prompts in turn, so a noisy VM's slow
minutes fall on all of them alike (separate `ssd-chat bench` runs here differ by up to 20% between runs).

    python scripts/ab_decode.py [--mode sd] [--variants compile-panel,compile-mkl,eager] [--repeats 4]
                                [--limit 4] [--max-tokens 128] [--core 0]

Variants: eager (the default engine), compile-panel (--compile, the panel kernel as an op), compile-mkl
(--compile with MKL's GEMM, as on a CPU without the panel kernel), avx2 (the default engine on the kernels' AVX2
build, as an AVX2 CPU runs them), no-kernels (none of our kernels: MKL's or oneDNN's; $SSD_CHAT_CPU_ISA=none),
draft-panels (the int8 draft on the 8-bit panels wherever q8 runs: $SSD_CHAT_DRAFT_PANELS=always), full-head
(greedy steps run the whole head, not the screened one: $SSD_CHAT_GREEDY_HEAD=0).
Prints decode tok/s per repeat and the median, and whether each variant's greedy tokens equal the first one's
(chat template applied, EOS respected). SSD needs a draft process on another core, which this script does not
start: use `ssd-chat bench` for it.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics

from engine import LLM, SamplingParams
from engine.affinity import pin
from engine.config import SpeculationConfig
from engine.layers import greedy_head, low_bits, native
from ssd_chat.prompts import DEFAULT_PROMPTS, load_prompts

VARIANTS = {"eager": dict(compile=False), "compile-panel": dict(compile=True, packed_kernel="panel"),
            "compile-mkl": dict(compile=True, packed_kernel="mkl"), "avx2": dict(), "no-kernels": dict(),
            "draft-panels": dict(), "full-head": dict()}
ENV = {"avx2": {native.ISA_ENV: "avx2"}, "no-kernels": {native.ISA_ENV: "none"},  # while the variant loads and runs
       "draft-panels": {low_bits.PANELS_ENV: "always"}, "full-head": {greedy_head.ENV: "0"}}


def use_env(name: str) -> None:
    """Variant `name`'s environment (every other variant's variables unset), from the kernels' next call on."""
    for variables in ENV.values():
        for variable in variables:
            os.environ.pop(variable, None)
    os.environ.update(ENV.get(name, {}))
    native.forget()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default="smollm2-135m-draft")
    parser.add_argument("--mode", default="sd", choices=["ar", "sd"])
    parser.add_argument("--variants", default="compile-panel,compile-mkl,eager")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--core", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    pin({args.core}, 1)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}: pick from {', '.join(VARIANTS)}")
    engines = {}
    for name in names:
        use_env(name)
        llm = LLM(target=args.target, draft=args.draft if args.mode == "sd" else None, **VARIANTS[name])
        llm.speculation = SpeculationConfig(mode=args.mode)
        engines[name] = llm
    prompts = [llm.encode_chat(m) for m in load_prompts(DEFAULT_PROMPTS, limit=args.limit)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    rates: dict[str, list[float]] = {name: [] for name in names}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for name, llm in engines.items():
            use_env(name)
            outs = [llm.generate([p], params)[0] for p in prompts]  # one at a time: batches never compile
            decoded = sum(o.stats.generated_tokens - 1 for o in outs)
            rates[name].append(decoded / sum(o.stats.decode_time_s for o in outs))
            tokens.setdefault(name, [o.token_ids for o in outs])
    first = tokens[names[0]]
    for name in names:
        runs = " ".join(f"{r:.1f}" for r in rates[name])
        print(f"{args.mode} {name:14s} median {statistics.median(rates[name]):6.2f} tok/s  ({runs})  "
              f"tokens = {names[0]}'s: {tokens[name] == first}")
    for llm in engines.values():
        llm.close()


if __name__ == "__main__":
    main()
