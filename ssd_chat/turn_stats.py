"""The figures of one assistant reply (the panel's, the stats line's, the export's stats table) and what it was
generated with; saved with it in the history (history.ChatMessage.stats, as json)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from engine.outputs import RequestOutput
from ssd_chat.reply_settings import ReplySettings


@dataclass(frozen=True)
class TurnStats:
    """The figures of one assistant reply, as shown in the panel and the exported stats table."""

    mode: str
    decode_tok_s: float
    ttft_s: float  # (to the stop, for a reply stopped before its first token: first_token_s)
    generated_tokens: int
    prompt_tokens: int
    reused_prefix_tokens: int
    finish_reason: str
    tau: float | None = None
    acceptance_rate: float | None = None
    cache_hit_rate: float | None = None
    tau_on_hit: float | None = None   # SSD: tau over the rounds that hit the speculation cache (None: older chats)
    tau_on_miss: float | None = None
    window: int = 0  # the first message in the model's view (ssd_chat.context_window); 0 too where not kept (older)
    settings: ReplySettings | None = None  # what the reply was generated with (None: not kept, older chats)

    @classmethod
    def from_dict(cls, data: dict) -> TurnStats:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "settings" in values:  # (a dict as saved)
            values["settings"] = ReplySettings.from_dict(values["settings"])
        return cls(**values)

    @classmethod
    def from_output(cls, output: RequestOutput, settings: ReplySettings | None = None) -> TurnStats:
        """The engine's figures for a finished reply; `settings`: what the app started it with, with the seed the
        reply sampled from (the chat's /seed, or the one the engine drew: /seed N and a regen give the reply again)."""
        s = output.stats
        if settings is not None:  # (greedy: None, whatever the chat's /seed)
            settings = replace(settings, seed=s.seed)
        return cls(
            mode=s.mode, decode_tok_s=s.decode_tok_s, ttft_s=s.ttft_s, generated_tokens=s.generated_tokens,
            prompt_tokens=s.prompt_tokens, reused_prefix_tokens=s.reused_prefix_tokens,
            finish_reason=str(output.finish_reason),
            tau=None if s.spec is None else s.spec.tau,
            acceptance_rate=None if s.spec is None else s.spec.acceptance_rate,
            cache_hit_rate=None if s.spec is None else s.spec.cache_hit_rate,
            tau_on_hit=None if s.spec is None else s.spec.tau_on_hit,
            tau_on_miss=None if s.spec is None else s.spec.tau_on_miss,
            settings=settings,
        )

    @property
    def first_token_s(self) -> float | None:
        """The time to the first token; None for a reply stopped before it (ttft_s then runs to the stop)."""
        return self.ttft_s if self.generated_tokens else None

    def line(self) -> str:
        """One dim line under a reply (and after it in plain mode)."""
        # (no prompt count: a reply the engine died under, which never told it)
        reused = f" · prefix reused {self.reused_prefix_tokens}/{self.prompt_tokens}" if self.prompt_tokens else ""
        if not self.generated_tokens:  # stopped during the prompt's prefill: no speed, TTFT or tau to speak of
            return f"0 tokens{reused} · stopped: {self.finish_reason}"
        if self.generated_tokens == 1:  # the prefill's token alone (an end of turn at once): no decode speed or tau
            text = f"TTFT {1000 * self.ttft_s:.0f} ms · 1 token{reused}"
        else:
            text = f"{self.decode_tok_s:.1f} tok/s · TTFT {1000 * self.ttft_s:.0f} ms · {self.generated_tokens} tokens"
            text += reused
        if self.tau is not None and self.generated_tokens > 1:
            text += f" · {self.mode} tau {self.tau:.2f} · accepted {self.acceptance_rate or 0.0:.0%}"
            if self.cache_hit_rate is not None:
                text += f" · cache hits {self.cache_hit_rate:.0%}"
        if self.finish_reason != "stop":
            text += f" · stopped: {self.finish_reason}"
        return text
