"""Engine-lifetime configuration: which model, where it runs, how much KV cache."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidParameterError
from engine.values import flag, normalise, number, optional, path, text, whole, wholes

DEFAULT_TARGET = "smollm2-135m"
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "sdpa", "flashinfer")
# (no torch here: the chat app's process imports this module before it starts the engine's)
DRAFT_WEIGHTS = ("float32", "float16", "int8")  # engine.layers.low_bits's kinds
KV_DTYPES = ("auto", "float16")  # the KV cache's: the model's dtype, or half (CPU: engine/kernels/attention.cpp)
CPU_MATMULS = ("mkl", "onednn", "panel", "panel4", "q8")  # engine.layers.packed_kernels' kernels
PACKED_KERNELS = ("auto", *CPU_MATMULS)
# Prompt tokens per prefill step. CPU: 256 let a cancel land within about a second even on one core of the
# 2-vCPU VM, at no measurable cost in prefill speed on one core and ~5% on two (README, "Chunked prefill");
# CUDA: not measured yet, vLLM's order of magnitude.
PREFILL_CHUNK = {"cpu": 256, "cuda": 2048}
# The most tokens a CPU round drafts, whatever k asks: engine.attention.sdpa.ROW_KERNEL_ROWS - 1, the verify rows that
# still give one-row decoding's bits (engine.spec_policy); here, torch-free, for the chat app's status line too
CPU_MAX_DRAFT = 31
# SSD's scratch slots per request (engine.ssd): its branches' tokens, branches * k (branches past them are dropped)
SCRATCH_SLOTS = 256
MAX_K = 32  # the most draft tokens per step SpeculationConfig.k takes
# The most CPU threads a rank takes: OpenMP could not start 20,000 (libgomp's one-line failure) and 99,999 crashed
MAX_THREADS = 1024
# The most candidates per accepted count: a round of one draft token holds SCRATCH_SLOTS branches, so a larger fan-out
# drafts none more (it only made each round rank the whole vocabulary, and 2**63 overflowed the draft process's channel)
MAX_FANOUT = SCRATCH_SLOTS


def capped(k: int, max_draft: int | None) -> int:
    """The most tokens a round drafts for a k of `k` where rounds draft at most `max_draft` (None: no cap)."""
    return k if max_draft is None else min(k, max_draft)


@dataclass(frozen=True)
class FastPath:
    """The fast paths, each with a switch (the CPU ignores eager and refuses flashinfer).

    attention "auto": flashinfer on CUDA when it imports (bf16/fp16), else SDPA. eager: no CUDA graphs for the
    decode step. compile: on CUDA torch.compile the model forward; on the CPU compile the one-sequence decode
    step (engine.compiled_decode).
    """

    attention: str = "auto"
    eager: bool = False
    compile: bool = False
    k_major: bool = True  # CPU: matmul weights stored K-major (engine.layers.linear.to_k_major); False: as loaded
    packed: bool = False  # CPU: packed weight copies for few-row steps (engine.layers.packed)
    packed_kernel: str = "auto"  # CPU: auto | mkl | onednn | panel | panel4 | q8 (auto: panel4, else mkl / onednn)
    draft_weights: str = "int8"  # CPU: the draft's matmul weights, float32 | float16 | int8 (engine.layers.low_bits)
    kv_dtype: str = "auto"  # CPU: "float16" keeps the KV cache in half (EngineConfig.kv_dtype)


@dataclass(frozen=True)
class EngineConfig:
    """Fixed for the life of an engine. Values are checked here, once.

    max_model_len None: the model's own limit. kv_cache_tokens None: room for two full contexts.
    threads None: torch's default for this machine.
    """

    target: str = DEFAULT_TARGET
    draft: str | None = None  # a draft model enables speculative modes
    device: str = "cpu"              # where the target runs when target_devices is not given
    tp: int = 1                      # target tensor-parallel ranks (one process each)
    target_devices: str | None = None  # e.g. "cpu:0-3" (cores, split over the TP ranks) or "cuda:0-3"
    draft_device: str | None = None  # e.g. "cpu:1" or "cuda:4": SSD's draft gets its own process there
    draft_timeout_s: float = 120.0   # a draft process that does not answer within this is lost (AR takes over)
    dtype: str = "auto"
    threads: int | None = None
    adapt_threads: bool = True       # CPU: fewer threads while other programs use the cores (engine.cpu_contention)
    companion_pids: tuple[int, ...] = ()  # processes whose work while the engine waits is its own (the chat app's UI)
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_tokens: int | None = None
    enable_prefix_caching: bool = True
    max_num_seqs: int = 16
    prefill_chunk_tokens: int | None = None  # prompt tokens per prefill step (all requests); None: PREFILL_CHUNK's
    seed: int | None = None          # the draws of sampled requests without their own seed; None: fresh ones each run
    attention: str = "auto"          # auto | sdpa | flashinfer (CUDA only)
    eager: bool = False              # CUDA: no decode CUDA graphs
    compile: bool = False            # CPU: compiled one-sequence decode step; CUDA: torch.compile the forward
    k_major_weights: bool = True     # CPU: K-major matmul weights (faster small-batch GEMM); False: as loaded
    packed_weights: bool = True      # CPU with a draft (or one_row_pays): packed weight copies (float32 ones: more
    #                                  memory; 4- and 8-bit ones: less, the weights they replace are released)
    packed_kernel: str = "auto"      # CPU: the packed copies' GEMM: auto | mkl | onednn | panel | panel4 | q8
    draft_weights: str = "int8"      # CPU: the draft's matmul weights (float32 | float16 | int8); never the target's
    kv_dtype: str = "auto"           # CPU: the KV cache's dtype, auto (the model's) | float16 (half the bytes a key:
    #                                  a long context's decode reads them all every token; the values rounded to half)

    @property
    def fast_path(self) -> FastPath:
        # only speculation runs several-row steps often enough to pay for the packed copies' memory (or, where
        # one-row steps gain from them too, every step: engine.layers.packed_kernels.one_row_pays); the compiled steps
        # (--compile) run MKL's GEMM, or the panel kernel as an op (engine.layers.panel.linear_op)
        from engine.layers import packed_kernels

        few_rows = self.draft is not None or packed_kernels.one_row_pays(self.packed_kernel)
        return FastPath(self.attention, self.eager, self.compile, self.k_major_weights,
                        packed=self.packed_weights and few_rows
                        and (not self.compile or packed_kernels.family(self.packed_kernel) == "panel"),
                        packed_kernel=self.packed_kernel, draft_weights=self.draft_weights, kv_dtype=self.kv_dtype)

    @property
    def prefill_chunk(self) -> int:
        """A long prompt prefills in steps of this many tokens, so a cancel (Esc) or a close lands between them."""
        return self.prefill_chunk_tokens or PREFILL_CHUNK["cuda" if self.on_cuda else "cpu"]

    @property
    def max_draft(self) -> int | None:
        """The most tokens a round drafts, whatever SpeculationConfig.k asks; None: k's own limit."""
        return None if self.on_cuda else CPU_MAX_DRAFT

    def drafted_k(self, k: int) -> int:
        """The most tokens a round drafts for SpeculationConfig.k = k: k, or max_draft where lower (the CPU's 31)."""
        return capped(k, self.max_draft)

    @property
    def on_cuda(self) -> bool:
        """Whether the target runs on GPUs (else on CPU cores)."""
        return (self.target_devices or self.device).startswith("cuda")

    def __post_init__(self) -> None:
        normalise(self, {"target": path, "draft": optional(path), "device": text, "target_devices": optional(text),
                         "draft_device": optional(text), "tp": whole, "threads": optional(whole),
                         "max_model_len": optional(whole), "block_size": whole, "kv_cache_tokens": optional(whole),
                         "max_num_seqs": whole, "prefill_chunk_tokens": optional(whole), "seed": optional(whole),
                         "draft_timeout_s": number, "enable_prefix_caching": flag, "eager": flag, "compile": flag,
                         "k_major_weights": flag, "packed_weights": flag,
                         "adapt_threads": flag, "companion_pids": wholes})
        if self.attention not in ATTENTION_BACKENDS:
            raise InvalidParameterError(
                f"attention must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention!r}"
            )
        if self.attention == "flashinfer" and not self.on_cuda:
            raise InvalidParameterError("--attention flashinfer needs a CUDA device: use --attention sdpa on the CPU")
        if self.draft_weights not in DRAFT_WEIGHTS:
            raise InvalidParameterError(
                f"draft weights must be one of {', '.join(DRAFT_WEIGHTS)}, got {self.draft_weights!r}"
            )
        if self.packed_kernel not in PACKED_KERNELS:
            raise InvalidParameterError(
                f"packed kernel (--cpu-matmul) must be one of {', '.join(PACKED_KERNELS)}, got {self.packed_kernel!r}"
            )
        if self.packed_kernel == "q8" and not self.on_cuda and not _q8_builds():
            raise InvalidParameterError(
                "--cpu-matmul q8 needs an x86 CPU with AVX2 and FMA and a C++ compiler: use --cpu-matmul auto"
            )
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidParameterError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.kv_dtype != "auto" and self.on_cuda:
            raise InvalidParameterError("--kv-dtype float16 is for the CPU: on CUDA the KV cache takes the model's "
                                        "dtype (--dtype float16 or bfloat16)")
        if self.dtype not in DTYPES:
            raise InvalidParameterError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            raise InvalidParameterError(f"threads must be between 1 and {MAX_THREADS}, got {self.threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidParameterError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InvalidParameterError(f"block_size must be a power of two, got {self.block_size}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise InvalidParameterError(f"kv_cache_tokens must be >= block_size, got {self.kv_cache_tokens}")
        if not self.draft_timeout_s > 0:  # (nan too)
            raise InvalidParameterError(f"draft_timeout_s must be > 0, got {self.draft_timeout_s}")
        if self.tp < 1:
            raise InvalidParameterError(f"tp must be >= 1, got {self.tp}")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise InvalidParameterError(f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}")
        if self.max_num_seqs < 1:
            raise InvalidParameterError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise InvalidParameterError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


MODES = ("ar", "sd", "ssd")
BACKUPS = ("jit", "fast")


@dataclass(frozen=True)
class SpeculationConfig:
    """How the engine decodes; may change between requests (the TUI switches modes live).

    ar: plain autoregressive decoding. sd: the draft proposes up to `k` tokens (fewer when the measured
    acceptance and round costs say so, unless adaptive_k is off), the target verifies them in one pass.
    ssd: as sd, with proposals pre-drafted for the likely outcomes of each verification.
    draft_temperature None: the draft samples at the request's temperature.
    """

    mode: str = "ar"
    k: int = 4
    draft_temperature: float | None = None
    fanout: tuple[int, ...] | None = None  # SSD: candidates per accepted count 0..k (None: geometric default)
    backup: str = "jit"  # SSD on a cache miss: "jit" re-drafts k tokens, "fast" guesses them from the context
    adaptive_k: bool = True  # draft the k <= `k` with the most expected tokens per second (engine.spec_length)
    lookup: bool = True  # draft the context lookup's token where it has one (engine.lookup)

    def __post_init__(self) -> None:
        normalise(self, {"k": whole, "fanout": optional(_fanout), "draft_temperature": optional(number),
                         "adaptive_k": flag, "lookup": flag})
        if self.mode not in MODES:
            raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (1 <= self.k <= MAX_K):
            raise InvalidParameterError(f"k (draft tokens per step) must be between 1 and {MAX_K}, got {self.k}")
        fanout = self.fanout
        if fanout is not None and (not fanout or any(f < 0 for f in fanout) or len(fanout) not in (1, self.k + 1)):
            raise InvalidParameterError(
                f"fanout must be one non-negative number or k+1 = {self.k + 1} of them, got {list(fanout)}"
            )
        if fanout is not None and max(fanout) > MAX_FANOUT:
            raise InvalidParameterError(f"fanout must be at most {MAX_FANOUT} candidates per accepted count (SSD's "
                                        f"speculation cache holds {SCRATCH_SLOTS} branch tokens a request), got "
                                        f"{max(fanout)}")
        if self.backup not in BACKUPS:
            raise InvalidParameterError(f"backup must be one of {', '.join(BACKUPS)}, got {self.backup!r}")
        if self.draft_temperature is not None and not (0.0 <= self.draft_temperature <= 100.0):
            raise InvalidParameterError(f"draft_temperature must be between 0 and 100, got {self.draft_temperature}")


def _fanout(name: str, value: object) -> tuple[int, ...]:
    """One number (for every outcome) or a list of them."""
    return (whole(name, value),) if isinstance(value, int) else wholes(name, value)


def _q8_builds() -> bool:
    from engine.layers import packed_kernels

    return packed_kernels.available("q8")


def check_has_draft(mode: str, has_draft: bool) -> None:
    """Refuse a speculative mode with no draft model to draft with (LLM.speculation; the chat app before it starts)."""
    if mode != "ar" and not has_draft:
        raise InvalidParameterError(f"mode {mode!r} needs a draft model: pass --draft")
