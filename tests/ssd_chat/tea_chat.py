"""The chat the history store's and the Markdown export's tests share: a haiku about tea with a code block, and
its reply's stats."""

from __future__ import annotations

from ssd_chat.history import ChatMessage, ChatSettings, Conversation, TurnStats

STATS = TurnStats(mode="ssd", decode_tok_s=41.25, ttft_s=0.081, generated_tokens=12, prompt_tokens=30,
                  reused_prefix_tokens=16, finish_reason="stop", tau=2.75, acceptance_rate=0.5, cache_hit_rate=0.8)


def tea_chat() -> Conversation:
    settings = ChatSettings(mode="ssd", k=3, fanout=(1, 2, 2, 1), temperature=0.0, max_tokens=64, system="Be brief.")
    return Conversation(None, "Tea", settings, [
        ChatMessage("user", "Write a haiku about tea."),
        ChatMessage("assistant", "Steam over the cup\n\n```python\nprint('tea')\n```", STATS),
    ])
