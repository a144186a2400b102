"""The first reply's TTFT after a resumed chat, with and without the chat app's warm-up (EngineProcess.warm).

A six-turn conversation (the first six chat prompts, each with a made-up reply) and a next prompt, through the chat
app's engine process on the embedded target; each case in a fresh engine process, alternating. The warm-up gets 3 s
before the prompt, as a user reading and typing would give it.

    python scripts/warm_ttft.py
"""

from __future__ import annotations

import time

from engine import SamplingParams
from engine.outputs import RequestFinished, RequestStats
from ssd_chat.prompts import DEFAULT_PROMPTS, load_prompts
from ssd_chat.tui.engine_process import EngineProcess


def first_reply(engine: EngineProcess, messages: list[dict[str, str]]) -> RequestStats:
    for event in engine.chat(messages, SamplingParams(temperature=0.0, max_tokens=8)):
        if isinstance(event, RequestFinished):
            return event.output.stats
    raise RuntimeError("the stream ended without a result")


def main() -> None:
    history = [{"role": "system", "content": "You are a helpful assistant."}]
    for messages in load_prompts(DEFAULT_PROMPTS, limit=6):
        history += [messages[-1], {"role": "assistant", "content": "Here is a careful answer. " * 12}]
    turn = [*history, {"role": "user", "content": "Thanks. One more: what is 2 + 2?"}]
    for warm in (False, True, False, True):
        engine = EngineProcess("smollm2-135m", threads=2)
        try:
            if warm:
                engine.warm(history)
                time.sleep(3.0)
            s = first_reply(engine, turn)
            print(f"warm-up {'on ' if warm else 'off'}: prompt {s.prompt_tokens} tokens, {s.reused_prefix_tokens} "
                  f"from the cache, TTFT {1000 * s.ttft_s:.0f} ms")
        finally:
            engine.close()


if __name__ == "__main__":
    main()
