"""`ssd-chat bench`: fixed-length greedy decoding over a prompt set, our engine against transformers.

Every mode decodes every prompt for exactly `max_tokens` tokens (EOS ignored; with ``ignore_eos=False``
replies end at the end of turn, as in a chat), one request at a
time, after one uncounted warm-up request, from the same prompt token ids. Per mode:
  decode tok/s = sum over prompts of (tokens - 1) / sum of decode times (first token -> last token);
                 a time-weighted mean, so one odd prompt cannot skew it;
  TTFT ms      = mean over prompts of (request start -> first generated token).
The engine runs with prefix caching off so that every prompt pays its full prefill, as in transformers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.distributed import pin
from engine.outputs import SpecStats
from engine.placement import plan
from ssd_chat.machine import machine_info, matvec_bandwidth_gb_s

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "chat.jsonl"
WARMUP_TOKENS = 8

Messages = list[dict[str, str]]
Progress = Callable[[str], None]


class BenchInputError(ValueError):
    """A prompt file or option the bench cannot use; ``str(err)`` is one line with the fix."""


@dataclass(frozen=True)
class BenchConfig:
    target: str
    prompts_file: Path = DEFAULT_PROMPTS
    modes: tuple[str, ...] = ("ar",)
    hf: bool = False
    max_tokens: int = 128
    threads: int | None = None
    raw: bool = False
    limit: int | None = None
    draft: str | None = None
    k: int = 4
    fanout: tuple[int, ...] | None = None
    backup: str = "jit"
    tp: int = 1
    target_devices: str | None = None  # AR, SD and SSD's target run here (the paper's convention)
    draft_device: str | None = None    # SSD's draft process (None: SSD drafts in the target's process)
    dtype: str = "auto"
    attention: str = "auto"
    eager: bool = False
    compile: bool = False
    ignore_eos: bool = True  # fixed-length replies (False: each stops at its end of turn, as in a chat)

    def __post_init__(self) -> None:
        if any(m not in ("ar", "ar-all") for m in self.modes) and self.draft is None:
            raise BenchInputError("modes sd and ssd need a draft model: pass --draft (e.g. --draft synthetic-draft)")
        unknown = [m for m in self.modes if m not in ENGINE_MODES]
        if unknown or not self.modes:
            raise BenchInputError(
                f"unknown mode(s) {', '.join(unknown) or '(none given)'}; available: {', '.join(ENGINE_MODES)}"
            )
        if self.max_tokens < 2:
            raise BenchInputError(f"--max-tokens must be >= 2 to measure decode speed, got {self.max_tokens}")
        if self.limit is not None and self.limit < 1:
            raise BenchInputError(f"--limit must be >= 1, got {self.limit}")


@dataclass(frozen=True)
class PromptRun:
    """One prompt decoded in one mode."""

    token_ids: list[int]
    ttft_s: float
    decode_time_s: float
    spec: SpecStats | None = None


@dataclass(frozen=True)
class ModeResult:
    mode: str
    runs: list[PromptRun]
    identical_to_ar: bool | None = None  # None for "ar" itself, or when "ar" was not run

    @property
    def outputs(self) -> list[list[int]]:
        return [r.token_ids for r in self.runs]

    @property
    def decode_tok_s(self) -> float:
        tokens = sum(len(r.token_ids) - 1 for r in self.runs)
        seconds = sum(r.decode_time_s for r in self.runs)
        return tokens / seconds if seconds > 0 else 0.0

    @property
    def ttft_ms(self) -> float:
        return 1000.0 * sum(r.ttft_s for r in self.runs) / len(self.runs)

    def _spec_sum(self, name: str) -> int | None:
        specs = [r.spec for r in self.runs if r.spec is not None]
        return sum(getattr(s, name) or 0 for s in specs) if specs else None

    @property
    def tau(self) -> float | None:
        """Tokens per target verify step over all prompts (None without speculation)."""
        steps = self._spec_sum("num_steps")
        return self._spec_sum("num_emitted") / steps if steps else None

    @property
    def acceptance_rate(self) -> float | None:
        drafted = self._spec_sum("num_drafted")
        return self._spec_sum("num_accepted") / drafted if drafted else None

    @property
    def cache_hit_rate(self) -> float | None:
        """SSD: verify steps whose proposal came from the speculation cache."""
        hits = self._spec_sum("num_cache_hits") if self.mode == "ssd" else None
        return hits / self._spec_sum("num_steps") if hits is not None and self._spec_sum("num_steps") else None

    @property
    def ideal_tok_s(self) -> float | None:
        """SSD's ceiling on these prompts: tau on hit over the mean verify time (the target never waits)."""
        hits = self._spec_sum("num_cache_hits") if self.mode == "ssd" else None
        if not hits:
            return None
        verify_s = sum(r.spec.verify_time_s for r in self.runs if r.spec is not None)
        return self._spec_sum("emitted_on_hit") / hits / (verify_s / self._spec_sum("num_steps"))

    @property
    def draft_s_per_token(self) -> float | None:
        """SD (draft in the target's process): the target's wait for drafts per drafted token, i.e. the draft's
        per-token cost on the target's cores (its catch-up forward on the last accepted tokens included)."""
        drafted = self._spec_sum("num_drafted") if self.mode == "sd" else None
        if not drafted:
            return None
        return sum(r.spec.draft_time_s for r in self.runs if r.spec is not None) / drafted

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "draft_s_per_token": self.draft_s_per_token,
            "ideal_tok_s": self.ideal_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "ttft_ms": self.ttft_ms,
            "tau": self.tau,
            "acceptance_rate": self.acceptance_rate,
            "cache_hit_rate": self.cache_hit_rate,
            "outputs": self.outputs,
            "identical_to_ar": self.identical_to_ar,
        }


@dataclass(frozen=True)
class BenchReport:
    machine: dict
    config: dict
    results: list[ModeResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"machine": self.machine, "config": self.config, "results": [r.to_dict() for r in self.results]}


def load_prompts(path: Path, *, limit: int | None = None) -> list[Messages]:
    """Read a prompt file: one plain-text prompt per line, or JSON objects with "prompt" or "messages"."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BenchInputError(f"cannot read prompt file {path}: {err.strerror or err}") from err
    prompts = [_parse_line(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise BenchInputError(f"prompt file {path} holds no prompts")
    return prompts[:limit]


def _parse_line(line: str, where: str) -> Messages:
    if not line.lstrip().startswith("{"):
        return [{"role": "user", "content": line.strip()}]
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise BenchInputError(f"{where}: invalid JSON ({err.msg})") from err
    if isinstance(obj.get("prompt"), str):
        return [{"role": "user", "content": obj["prompt"]}]
    messages = obj.get("messages")
    is_valid = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    )
    if not is_valid:
        raise BenchInputError(f'{where}: needs a "prompt" string or a "messages" list of {{role, content}}')
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def encode_prompts(llm: LLM, prompts: list[Messages], *, raw: bool) -> list[list[int]]:
    """Token ids per prompt: chat template applied, or (raw) the message contents joined by blank lines."""
    if not raw:
        return [llm.encode_chat(messages) for messages in prompts]
    return [llm.tokenizer.encode("\n\n".join(m["content"] for m in messages)) for messages in prompts]


def run_engine_mode(
    llm: LLM, spec: SpeculationConfig, prompt_ids: list[list[int]], max_tokens: int, progress: Progress, *,
    ignore_eos: bool = True,
) -> ModeResult:
    llm.speculation = spec
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    llm.generate([prompt_ids[0]], replace(params, max_tokens=min(max_tokens, WARMUP_TOKENS)))
    runs = []
    for i, ids in enumerate(prompt_ids, 1):
        progress(f"{spec.mode}: prompt {i}/{len(prompt_ids)}")
        out = llm.generate([ids], params)[0]
        runs.append(PromptRun(list(out.token_ids), out.stats.ttft_s, out.stats.decode_time_s, out.stats.spec))
    return ModeResult(spec.mode, runs)


ENGINE_MODES = ("ar", "sd", "ssd", "ar-all")  # ar-all: AR in one process on every core of the machine


def run_hf(
    model_path: Path, prompt_ids: list[list[int]], max_tokens: int, progress: Progress, *,
    draft_path: Path | None = None, k: int = 4, ignore_eos: bool = True,
) -> ModeResult:
    """transformers' own generate() on the same weights, prompts and thread count (set by the engine);
    with `draft_path`, its assisted generation (assistant_model) drafting a constant k tokens."""
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

    def generate(ids: list[int], num_tokens: int) -> PromptRun:
        config = GenerationConfig(do_sample=False, max_new_tokens=num_tokens, pad_token_id=pad_id)
        streamer = _TimingStreamer()
        input_ids = torch.tensor([ids])
        start = time.perf_counter()
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, streamer=streamer,
            assistant_model=assistant,
        )
        token_ids = out[0, len(ids):].tolist()
        first, last = streamer.first_token_time(), streamer.times[-1]
        return PromptRun(token_ids, ttft_s=first - start, decode_time_s=last - first)

    generate(prompt_ids[0], min(max_tokens, WARMUP_TOKENS))
    runs = []
    for i, ids in enumerate(prompt_ids, 1):
        progress(f"{mode}: prompt {i}/{len(prompt_ids)}")
        runs.append(generate(ids, max_tokens))
    return ModeResult(mode, runs)


class _TimingStreamer(BaseStreamer):
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


def run_bench(config: BenchConfig, progress: Progress = lambda _msg: None) -> BenchReport:
    prompts = load_prompts(config.prompts_file, limit=config.limit)
    model_path, draft_path, prompt_ids, results, bound = _run_engine_modes(config, prompts, progress)
    ar = next((r for r in results if r.mode == "ar"), None)
    results = [replace(r, identical_to_ar=r.outputs == ar.outputs) if ar and r is not ar else r for r in results]
    if config.hf:
        progress("loading the transformers baseline")
        with _on_target_cores(config):  # the same cores and threads as our target
            baselines = [run_hf(model_path, prompt_ids, config.max_tokens, progress, ignore_eos=config.ignore_eos)]
            if draft_path is not None:
                baselines.append(run_hf(model_path, prompt_ids, config.max_tokens, progress, draft_path=draft_path,
                                        k=config.k, ignore_eos=config.ignore_eos))
        results += [replace(b, identical_to_ar=None if ar is None else b.outputs == ar.outputs) for b in baselines]
    run_config = {
        "target": config.target, "draft": config.draft, "k": config.k, "fanout": config.fanout,
        "model_path": str(model_path),
        "max_tokens": config.max_tokens, "ignore_eos": config.ignore_eos,
        "threads": config.threads, "prompts_file": str(config.prompts_file), "raw": config.raw,
        "tp": config.tp, "target_devices": config.target_devices, "draft_device": config.draft_device,
        "backup": config.backup, "dtype": config.dtype, "attention": config.attention, "eager": config.eager,
        "compile": config.compile,
        "num_prompts": len(prompts), "prefix_caching": False, **bound,
    }
    return BenchReport(machine_info(), run_config, results)


def _run_engine_modes(
    config: BenchConfig, prompts: list[Messages], progress: Progress
) -> tuple[Path, Path | None, list[list[int]], list[ModeResult], dict]:
    """Our engine in each requested mode; its weights are freed on return, before any baseline loads."""
    progress(f"loading {config.target}")
    llm = LLM(target=config.target, draft=config.draft, threads=config.threads, enable_prefix_caching=False,
              tp=config.tp, target_devices=config.target_devices, draft_device=config.draft_device, dtype=config.dtype,
              attention=config.attention, eager=config.eager, compile=config.compile)
    try:
        prompt_ids = encode_prompts(llm, prompts, raw=config.raw)
        results = [
            run_engine_mode(llm, SpeculationConfig(mode=mode, k=config.k, fanout=config.fanout, backup=config.backup),
                            prompt_ids, config.max_tokens, progress, ignore_eos=config.ignore_eos)
            for mode in config.modes if mode != "ar-all"
        ]
        layout = llm.layout
        progress("measuring memory bandwidth")
        bandwidth = matvec_bandwidth_gb_s(str(llm.device))
        bound = {"weight_bytes": llm.weight_bytes, "matvec_gb_s": round(bandwidth, 1),
                 "bandwidth_bound_tok_s": round(bandwidth * 1e9 / llm.weight_bytes, 1)}
    finally:
        llm.close()
    if "ar-all" in config.modes:
        progress(f"loading {config.target} on every core")
        with LLM(target=config.target, threads=os.cpu_count(), enable_prefix_caching=False) as every_core:
            result = run_engine_mode(every_core, SpeculationConfig(mode="ar"), prompt_ids, config.max_tokens, progress,
                                     ignore_eos=config.ignore_eos)
            results.append(replace(result, mode="ar-all"))
    return llm.model_path, getattr(llm, "draft_path", None), prompt_ids, results, {**bound, "layout": layout}


@contextmanager
def _on_target_cores(config: BenchConfig) -> Iterator[None]:
    placement = plan(config.tp, config.target_devices, None, config.threads)
    saved = os.sched_getaffinity(0)
    pin(placement.target[0].cores, placement.threads_for(placement.target[0]))
    try:
        yield
    finally:
        pin(saved, None)
