"""`ssd-chat bench`'s settings, checked as they are made: torch-free, so that the CLI refuses a wrong one before
torch and transformers load (ssd_chat.bench runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.sampling_params import SamplingParams
from ssd_chat.bench_results import ENGINE_MODES
from ssd_chat.cli_options import check_before_loading
from ssd_chat.prompts import DEFAULT_PROMPTS, BenchInputError, Messages, load_prompts
from ssd_chat.setting_words import FLAGS, check_sampling, listed


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
    draft_weights: str = "int8"  # CPU: the draft's matmul weights (engine.layers.low_bits)
    packed_kernel: str = "auto"  # CPU: the target's few-row matmul kernel (engine.layers.packed)
    kv_dtype: str = "auto"  # CPU: the KV cache's dtype (auto: the model's; float16: half)
    adapt_threads: bool = True  # CPU: fewer threads while other programs use the cores (engine.cpu_contention)
    ignore_eos: bool = True  # fixed-length replies (False: each stops at its end of turn, as in a chat)
    adaptive_k: bool = True  # draft the k <= `k` with the most expected tokens per second (False: always k)
    lookup: bool = True  # drafts take the context lookup's token where it has one (engine.lookup)
    temperature: float = 0.0  # > 0: sampled replies, prompt i seeded with seed + i (the same in every mode)
    top_p: float = 1.0  # sampled replies: the nucleus (1 = off)
    seed: int = 0
    sampler: str = "coupled"  # sampled replies: engine.sampling_params.SAMPLERS

    def __post_init__(self) -> None:
        if not self.modes or any(m not in ENGINE_MODES for m in self.modes):  # (as cli_options.word_list refuses)
            raise BenchInputError(f"--modes takes {listed(ENGINE_MODES)}, separated by commas; got "
                                  f"{','.join(self.modes)!r}")
        if any(m not in ("ar", "ar-all") for m in self.modes) and self.draft is None:
            raise BenchInputError("modes sd, ssd and sd-all need a draft model: pass --draft (e.g. --draft"
                                  " smollm2-135m-draft)")
        if self.max_tokens < 2:
            raise BenchInputError(f"--max-tokens takes at least 2 (a decode speed needs two tokens); got "
                                  f"{self.max_tokens}")
        if self.limit is not None and self.limit < 1:
            raise BenchInputError(f"--limit takes at least 1; got {self.limit}")
        check_sampling(FLAGS, self.temperature, self.top_p, 0)  # a bad --temperature or --top-p, in the options' words,
        self.sampling(0)  # and a bad --seed: its one line now, before any model loads

    def sampling(self, index: int, max_tokens: int | None = None) -> SamplingParams:
        """The settings of prompt `index`'s reply (`max_tokens`: the warm-up's fewer)."""
        seed = None if self.temperature == 0 else self.seed + index
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=seed,
                              max_tokens=max_tokens or self.max_tokens, ignore_eos=self.ignore_eos,
                              sampler=self.sampler)

    def fast_path(self) -> dict:
        """The LLM options of the engine's fast paths, every mode's."""
        return dict(dtype=self.dtype, attention=self.attention, eager=self.eager, compile=self.compile,
                    draft_weights=self.draft_weights, packed_kernel=self.packed_kernel, kv_dtype=self.kv_dtype,
                    adapt_threads=self.adapt_threads)

    def placed(self) -> dict:
        """The LLM options that place the target and draft (the modes on the target's cores)."""
        return dict(draft=self.draft, threads=self.threads, tp=self.tp, target_devices=self.target_devices,
                    draft_device=self.draft_device)

    def checked_prompts(self) -> list[Messages]:
        """The prompts, once everything a run could refuse before its first model loads is checked: the prompt
        file, the last prompt's seed, the models' names and directories, the placement (no torch: the CLI's first
        step)."""
        prompts = load_prompts(self.prompts_file, limit=self.limit)
        self.sampling(len(prompts) - 1)
        check_before_loading(self.target, {**self.placed(), **self.fast_path()})
        return prompts

