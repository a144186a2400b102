"""The engine on every core beside another program: decode speed with the thread governor (engine.cpu_contention)
and without it (--fixed-threads), beside duty-cycle loads, and when a busy loop starts and stops mid-reply.

    python scripts/busy_cpu.py [--mode ar|sd] [--loads 0,0.25,0.5,0.75,1] [--rounds 2] [--limit 4]
                               [--max-tokens 128] [--reply-tokens 900]

One engine with a thread a core it may use (`LLM(threads=len(affinity.usable()))`); for each load, a child process
that is busy for that share of every 10 ms (1: a busy loop), then the prompts of assets/prompts/chat.jsonl through
the chat template, greedy, alternately with the governor and with every thread, `--rounds` times. Prints tok/s, the
share of steps on fewer threads, and whether every round's tokens equal the first's. Then one long reply, a busy
loop from 2 s to 5 s: when the thread count changed. Linux only (the governor reads /proc/stat).
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time

from engine import LLM, SamplingParams, ThreadsChanged, TokenDelta, affinity
from ssd_chat.prompts import DEFAULT_PROMPTS, load_prompts

# Busy for `share` (argv[1]) of every 10 ms, asleep the rest, until killed: a child of its own that imports nothing
# more (a spawned process would import this module, and torch with it: seconds of a whole core)
DUTY = """
import sys, time
share = float(sys.argv[1])
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < share * 0.01:
        pass
    if share < 1:
        time.sleep((1 - share) * 0.01)
"""


def load(share: float) -> subprocess.Popen | None:
    if share <= 0:
        return None
    child = subprocess.Popen([sys.executable, "-c", DUTY, str(share)])
    time.sleep(0.3)  # (started)
    return child


def stop(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()


def rate(llm: LLM, prompts: list[list[int]], params: SamplingParams, governed: bool, governor) -> tuple:
    """tok/s over `prompts`, the share of steps on fewer threads, and the tokens."""
    llm.core_share.governor = governor if governed else None
    steps, fewer = llm.core_share.steps, llm.core_share.steps_on_fewer
    start, tokens = time.perf_counter(), []
    for ids in prompts:
        tokens.append(llm.generate([ids], params)[0].token_ids)
    seconds = time.perf_counter() - start
    share = (llm.core_share.steps_on_fewer - fewer) / max(1, llm.core_share.steps - steps)
    return sum(map(len, tokens)) / seconds, share, tokens


def timeline(llm: LLM, ids: list[int], max_tokens: int) -> str:
    """One reply with a busy loop from 2 s to 5 s: when the load came and went, and when the count changed."""
    marks, child, start = [], None, time.perf_counter()
    for event in llm.stream(ids, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)):
        now = time.perf_counter() - start
        if isinstance(event, ThreadsChanged):
            marks.append(f"{event.threads} of {event.most} threads at {now:.2f} s")
        elif isinstance(event, TokenDelta) and child is None and 2 < now < 5:
            child = load(1.0)
            marks.append(f"busy loop from {now:.2f} s")
        elif isinstance(event, TokenDelta) and child is not None and now > 5 and child.poll() is None:
            stop(child)
            marks.append(f"busy loop gone at {now:.2f} s")
    if child is not None:
        stop(child)
    return ", ".join(marks) + f"; the reply ended at {time.perf_counter() - start:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default="smollm2-135m-draft")
    parser.add_argument("--mode", default="sd", choices=["ar", "sd"])
    parser.add_argument("--loads", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reply-tokens", type=int, default=900)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    draft = dict(draft=args.draft, mode="sd", k=4) if args.mode == "sd" else {}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    threads = len(affinity.usable())  # (not os.cpu_count(): under taskset or a cpuset, more threads than cores)
    with LLM(args.target, threads=threads, **draft) as llm:
        governor = llm.core_share.governor
        if governor is None:
            parser.error("no thread governor here: it needs Linux's /proc/stat and at least two cores")
        prompts = [llm.encode_chat(m) for m in load_prompts(DEFAULT_PROMPTS, limit=args.limit)]
        first = rate(llm, prompts, params, True, governor)[2]  # (warm-up; every round's tokens against these)
        print(f"{args.mode}, {threads} threads, {len(prompts)} prompts x {args.max_tokens} tokens: tok/s "
              "(share of steps on fewer threads)")
        for share in (float(x) for x in args.loads.split(",")):
            child, rows, same = load(share), {True: [], False: []}, True
            for i in range(args.rounds):
                for governed in (True, False) if i % 2 == 0 else (False, True):
                    tok_s, fewer, tokens = rate(llm, prompts, params, governed, governor)
                    rows[governed].append(f"{tok_s:.1f} ({fewer:.0%})" if governed else f"{tok_s:.1f}")
                    same &= tokens == first
            if child is not None:
                stop(child)
            print(f"load {share:g}: governor {', '.join(rows[True])} | every thread {', '.join(rows[False])} | "
                  f"tokens {'the same' if same else 'DIFFER'}", flush=True)
        llm.core_share.governor = governor
        print(timeline(llm, prompts[0], args.reply_tokens))


if __name__ == "__main__":
    main()
