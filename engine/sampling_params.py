"""Per-request sampling parameters, validated once on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import InvalidParameterError
from engine.values import flag, normalise, number, optional, texts, whole, wholes

MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1  # the largest seed: torch's generators take a signed 64-bit one
# How a sampled request draws its tokens, both exact in every mode: "coupled", the race of engine.coupling (a seeded
# reply is the same in AR, SD and SSD; drafts are kept where they equal the target's token, as greedy's are); or
# "rejection", a generator's inverse-CDF draws and the rejection rule of speculative sampling (engine.speculative)
SAMPLERS = ("coupled", "rejection")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature 0 means greedy. ``top_k=0`` and ``top_p=1.0`` disable those filters. ``seed`` makes a
    sampled request reproducible (None: drawn from the engine's generator). ``stop`` strings end the
    reply before the string (the string itself is not returned); ``stop_token_ids`` and EOS end it after
    that token (kept in ``token_ids``, not in the text). ``ignore_eos`` runs to ``max_tokens`` (for
    fixed-length benchmarks). ``sampler``: one of SAMPLERS.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    sampler: str = "coupled"

    def __post_init__(self) -> None:
        normalise(self, {"temperature": number, "top_p": number, "top_k": whole, "max_tokens": whole,
                         "seed": optional(whole), "stop": texts, "stop_token_ids": wholes, "ignore_eos": flag})
        if not (0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise InvalidParameterError(
                f"temperature must be between 0 and {MAX_TEMPERATURE:g} (0 = greedy), got {self.temperature}"
            )
        if self.top_k < 0:
            raise InvalidParameterError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise InvalidParameterError(f"seed must be in 0..2^63-1, got {self.seed}")
        if self.sampler not in SAMPLERS:
            raise InvalidParameterError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if any(s == "" for s in self.stop):
            raise InvalidParameterError("stop strings must not be empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidParameterError("stop_token_ids must be non-negative token ids")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
