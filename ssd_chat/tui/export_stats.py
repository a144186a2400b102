"""What an export (Markdown or plain text) says of the chat's settings and of each reply's figures: one sentence, and
the cells of the stats table, which each format lays out its own way."""

from __future__ import annotations

from ssd_chat.history import ChatMessage, ChatSettings
from ssd_chat.sampling_defaults import filters_text
from ssd_chat.setting_words import fanout_text, number_text

STATS_HEADER = ("turn", "mode", "settings", "tokens", "decode tok/s", "TTFT ms", "tau", "acceptance", "cache hits",
                "prefix reused", "finish")


def settings_sentence(s: ChatSettings, mode: str, k: int | None = None) -> str:
    """The chat's settings at export time; `mode` as the format writes it (Markdown: as code); k only in SD and SSD
    (AR drafts nothing), `k` where given: what the engine drafts for the chat's (EngineConfig.drafted_k); the fan-out
    in SSD where set (none: the default)."""
    filters = filters_text(s.temperature, s.top_p, s.top_k, ", ", seed=s.seed)
    drafts = "" if s.mode == "ar" else f"k {s.k if k is None else k}, "
    drafts += f"fan-out {fanout_text(s.fanout)}, " if s.mode == "ssd" and s.fanout is not None else ""
    return (f"Mode {mode}, {drafts}temperature {number_text(s.temperature)}, {filters + ', ' if filters else ''}"
            f"max tokens {s.max_tokens} (the chat's settings when exported; the stats give each reply's own).")


def stats_rows(messages: list[ChatMessage]) -> list[tuple[str, ...]]:
    """A row of cells (STATS_HEADER's) per reply that has stats, numbered from 1."""
    replies = [m.stats for m in messages if m.role == "assistant" and m.stats is not None]
    rows = []
    for i, st in enumerate(replies, start=1):
        ttft = "–" if st.first_token_s is None else f"{1000 * st.first_token_s:.0f}"  # (none: stopped in the prefill)
        settings = "" if st.settings is None else st.settings.text(ran=st.mode)  # (none: kept only since they are)
        rows.append((str(i), st.mode, settings, str(st.generated_tokens), f"{st.decode_tok_s:.1f}", ttft,
                     _opt(st.tau, "{:.2f}"), _opt(st.acceptance_rate, "{:.0%}"), _opt(st.cache_hit_rate, "{:.0%}"),
                     f"{st.reused_prefix_tokens}/{st.prompt_tokens}" if st.prompt_tokens else "–", st.finish_reason))
    return rows


def _opt(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)
