"""`ssd-chat bench`: fixed-length decoding (greedy, or sampled and seeded) over a prompt set, our engine against
transformers.

Every mode decodes every prompt for exactly `max_tokens` tokens (EOS ignored; with ``ignore_eos=False``
replies end at the end of turn, as in a chat), one request at a
time, after one uncounted warm-up request, from the same prompt token ids. Per mode:
  decode tok/s = sum over prompts of (tokens - 1) / sum of decode times (first token -> last token);
                 a time-weighted mean, so one odd prompt cannot skew it;
  TTFT ms      = mean over prompts of (request start -> first generated token).
The engine runs with prefix caching off so that every prompt pays its full prefill, as in transformers.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from engine import LLM
from engine.affinity import pin, usable
from engine.config import SpeculationConfig
from engine.layers.packed_kernels import resolve_kernel
from engine.placement import plan
from ssd_chat.bench_config import BenchConfig
from ssd_chat.bench_results import EVERY_CORE, BenchReport, ModeResult, PromptRun
from ssd_chat.machine import machine_info, read_bandwidth_gb_s
from ssd_chat.prompts import Messages, encode_prompts

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8

Progress = Callable[[str], None]


def run_engine_mode(
    llm: LLM, spec: SpeculationConfig, prompt_ids: list[list[int]], config: BenchConfig, progress: Progress,
    name: str | None = None,
) -> ModeResult:
    """One row: `spec`'s mode over every prompt, named `name` (default: the mode; ar-all runs AR)."""
    name = name or spec.mode
    llm.speculation = spec
    llm.generate([prompt_ids[0]], config.sampling(0, min(config.max_tokens, WARMUP_TOKENS)))
    runs = []
    runner = llm.core.runner
    compiled_before, forwards_before = (runner.compiled.num_runs if runner.compiled else 0), runner.num_forwards
    steps_before, fewer_before = llm.core_share.steps, llm.core_share.steps_on_fewer
    for i, ids in enumerate(prompt_ids):
        progress(f"{name}: prompt {i + 1}/{len(prompt_ids)}")
        out = llm.generate([ids], config.sampling(i))[0]
        runs.append(PromptRun(list(out.token_ids), out.stats.ttft_s, out.stats.decode_time_s, out.stats.spec))
    cost = llm.core.policy.round_cost.get(spec.mode)
    measured = cost is not None and cost.verify_one_row_s is not None
    compiled_share = None
    if runner.compiled is not None and runner.num_forwards > forwards_before:
        compiled_share = (runner.compiled.num_runs - compiled_before) / (runner.num_forwards - forwards_before)
        if compiled_share < 0.9:
            log.warning("%s: only %.0f%% of the target's forwards ran compiled (the rest eager)", name,
                        100 * compiled_share)
    return ModeResult(name, runs, row_cost=round(cost.fit.value, 3) if measured else None,
                      compiled_share=compiled_share,
                      fewer_threads_share=(llm.core_share.steps_on_fewer - fewer_before)
                      / max(1, llm.core_share.steps - steps_before))


def run_hf(
    model_path: Path, prompt_ids: list[list[int]], config: BenchConfig, progress: Progress, *,
    draft_path: Path | None = None,
) -> ModeResult:
    """transformers' own generate() on the same weights, prompts, settings and thread count (set by the engine);
    with `draft_path`, its assisted generation (assistant_model) drafting a constant k tokens."""
    max_tokens, k, ignore_eos = config.max_tokens, config.k, config.ignore_eos
    mode = "hf" if draft_path is None else "hf-assisted"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    assistant = None
    if draft_path is not None:
        from ssd_chat.distill_model import load_hf_draft  # a compact ssd-chat draft needs the target's embedding

        assistant = load_hf_draft(draft_path, model_path)
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        if ignore_eos:
            assistant.generation_config.eos_token_id = None
    # Like ignore_eos in the engine: EOS neither ends the reply nor is masked out (min_new_tokens would mask
    # it, and greedy outputs would then differ after the first EOS). A None in the GenerationConfig passed
    # to generate() is filled in from the model's own, so the model's own must forget EOS.
    pad_id = model.generation_config.pad_token_id
    if pad_id is None:
        pad_id = model.generation_config.eos_token_id
    if ignore_eos:
        model.generation_config.eos_token_id = None

    def generate(index: int, ids: list[int], num_tokens: int) -> PromptRun:
        sampled = {} if config.temperature == 0 else {"temperature": config.temperature, "top_k": 0,
                                                       "top_p": config.top_p}
        settings = GenerationConfig(do_sample=bool(sampled), max_new_tokens=num_tokens, pad_token_id=pad_id, **sampled)
        if sampled:
            torch.manual_seed(config.seed + index)
        streamer = TimingStreamer()
        input_ids = torch.tensor([ids])
        start = time.perf_counter()
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=settings, streamer=streamer,
            assistant_model=assistant,
        )
        token_ids = out[0, len(ids):].tolist()
        first, last = streamer.first_token_time(), streamer.times[-1]
        return PromptRun(token_ids, ttft_s=first - start, decode_time_s=last - first)

    generate(0, prompt_ids[0], min(max_tokens, WARMUP_TOKENS))
    runs = []
    for i, ids in enumerate(prompt_ids):
        progress(f"{mode}: prompt {i + 1}/{len(prompt_ids)}")
        runs.append(generate(i, ids, max_tokens))
    return ModeResult(mode, runs)


class TimingStreamer(BaseStreamer):
    """Timestamps generate()'s put() calls: the first one carries the prompt, then new tokens (one per
    call, or several at once in assisted generation)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def first_token_time(self) -> float:
        assert len(self.times) >= 2, "generate() streamed no new token"
        return self.times[1]

    def end(self) -> None:
        pass


def run_bench(config: BenchConfig, progress: Progress = lambda _msg: None,
              prompts: list[Messages] | None = None) -> BenchReport:
    """`prompts`: those `config.checked_prompts()` gave (the CLI's, before torch loaded); None: checked here."""
    prompts = config.checked_prompts() if prompts is None else prompts
    model_path, draft_path, prompt_ids, results, bound = _run_engine_modes(config, prompts, progress)
    # greedy, or sampled by the coupled race: each mode's tokens against AR's (sampled by the rejection rule: the same
    # distribution, not the same tokens)
    same = config.temperature == 0 or config.sampler == "coupled"
    ar = next((r for r in results if r.mode == "ar"), None) if same else None
    results = [replace(r, identical_to_ar=r.outputs == ar.outputs) if ar and r is not ar else r for r in results]
    if config.hf:
        progress("loading the transformers baseline")
        with _on_target_cores(config):  # the same cores and threads as our target
            baselines = [run_hf(model_path, prompt_ids, config, progress)]
            if draft_path is not None:
                baselines.append(run_hf(model_path, prompt_ids, config, progress, draft_path=draft_path))
        results += [replace(b, identical_to_ar=None if ar is None or config.temperature else b.outputs == ar.outputs)
                    for b in baselines]  # (transformers samples by its own draws)
    run_config = {
        "target": config.target, "draft": config.draft, "k": config.k, "fanout": config.fanout,
        "model_path": str(model_path),
        "max_tokens": config.max_tokens, "ignore_eos": config.ignore_eos, "temperature": config.temperature,
        "top_p": config.top_p if config.temperature else None, "seed": config.seed if config.temperature else None,
        "sampler": config.sampler if config.temperature else None,
        "threads": config.threads, "prompts_file": str(config.prompts_file), "raw": config.raw,
        "tp": config.tp, "target_devices": config.target_devices, "draft_device": config.draft_device,
        "backup": config.backup, "adaptive_k": config.adaptive_k, "lookup": config.lookup,
        "dtype": config.dtype, "attention": config.attention,
        "eager": config.eager, "compile": config.compile, "draft_weights": config.draft_weights,
        "kv_dtype": config.kv_dtype, "adapt_threads": config.adapt_threads,
        "packed_kernel": resolve_kernel(config.packed_kernel),  # the CPU kernel "auto" picked here
        "num_prompts": len(prompts), "prefix_caching": False, **bound,
    }
    return BenchReport(machine_info(), run_config, results)


def _run_engine_modes(
    config: BenchConfig, prompts: list[Messages], progress: Progress
) -> tuple[Path, Path | None, list[list[int]], list[ModeResult], dict]:
    """Our engine in each requested mode; its weights are freed on return, before any baseline loads."""
    fast, placed = config.fast_path(), config.placed()
    progress(f"loading {config.target}")
    llm = LLM(target=config.target, enable_prefix_caching=False, **placed, **fast)
    try:
        prompt_ids = encode_prompts(llm, prompts, raw=config.raw)
        results = [run_engine_mode(llm, _speculation(config, mode), prompt_ids, config, progress)
                   for mode in config.modes if mode not in EVERY_CORE]
        layout = llm.layout
        progress("measuring memory bandwidth")
        rates = read_bandwidth_gb_s(str(llm.device))
        bandwidth = max(rates.values())
        bound = {"weight_bytes": llm.weight_bytes, "matvec_gb_s": round(rates["matvec"], 1),
                 "sum_gb_s": round(rates["sum"], 1),
                 "bandwidth_bound_tok_s": round(bandwidth * 1e9 / llm.weight_bytes, 1)}
    finally:
        llm.close()
    every = [mode for mode in config.modes if mode in EVERY_CORE]
    if every:
        progress(f"loading {config.target} on every core")
        draft = config.draft if "sd-all" in every else None
        with LLM(target=config.target, draft=draft, threads=os.cpu_count(), enable_prefix_caching=False,
                 **fast) as every_core:
            for mode in every:
                results.append(run_engine_mode(every_core, _speculation(config, EVERY_CORE[mode]), prompt_ids,
                                               config, progress, mode))
    return llm.model_path, llm.draft_path, prompt_ids, results, {**bound, "layout": layout}


def _speculation(config: BenchConfig, mode: str) -> SpeculationConfig:
    return SpeculationConfig(mode=mode, k=config.k, fanout=config.fanout, backup=config.backup,
                             adaptive_k=config.adaptive_k, lookup=config.lookup)


@contextmanager
def _on_target_cores(config: BenchConfig) -> Iterator[None]:
    placement = plan(config.tp, config.target_devices, None, config.threads)
    saved = usable()
    pin(placement.target[0].cores, placement.threads_for(placement.target[0]))
    try:
        yield
    finally:
        pin(saved, None)
