"""What one assistant reply was generated with: the chat's decoding mode and sampling settings when it started.

A chat's settings change between replies (/temp, /top-p, /top-k, /seed, /mode, /k, /fanout); each reply keeps its own in
its stats (history.TurnStats.settings), so the export can say what each reply used. Replies saved before these
were kept have none (None).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from ssd_chat.sampling_defaults import filters_text
from ssd_chat.setting_words import fanout_text, number_text

if TYPE_CHECKING:
    from ssd_chat.history import ChatSettings


@dataclass(frozen=True)
class ReplySettings:
    mode: str
    k: int
    fanout: tuple[int, ...] | None
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None = None  # the seed it sampled from (the chat's /seed, or the engine's draw); None: greedy, older

    @classmethod
    def of(cls, settings: ChatSettings, k: int | None = None) -> ReplySettings:
        """The settings a reply of a chat with `settings` starts with; `k`: what the engine drafts for the chat's k
        (EngineConfig.drafted_k: /k 32 on the CPU drafts 31, as the status line says), where it is known."""
        return cls(settings.mode, settings.k if k is None else k, settings.fanout, settings.temperature,
                   settings.top_p, settings.top_k, settings.max_tokens, settings.seed)

    @classmethod
    def from_dict(cls, data: object) -> ReplySettings | None:
        """As saved (json); None for anything else (a hand-edited file): the reply then shows no settings."""
        if not isinstance(data, dict):
            return None
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if isinstance(values.get("fanout"), list):  # (saved as a list)
            values["fanout"] = tuple(values["fanout"])
        try:
            return cls(**values)
        except TypeError:  # a field missing
            return None

    def text(self, sep: str = ", ", ran: str | None = None) -> str:
        """Compact, for the export's stats table: "k 4, temp 0.7, top-p 0.9"; "temp 0" for a greedy AR reply (its
        filters do nothing: sampling_defaults.filters_text). k only where the reply drafted: started in SD or SSD and,
        where `ran` is given (the mode its stats give), run in it (AR where the draft process was lost); the fan-out
        only where an SSD reply's was set (/fanout, --fanout: "fan-out 1,2,2"), none: the default."""
        parts = [] if "ar" in (self.mode, ran) else [f"k {self.k}"]
        if self.mode == "ssd" and ran in (None, "ssd") and self.fanout is not None:
            parts.append(f"fan-out {fanout_text(self.fanout)}")
        parts.append(f"temp {number_text(self.temperature)}")
        filters = filters_text(self.temperature, self.top_p, self.top_k, sep, seed=self.seed)
        return sep.join(parts + ([filters] if filters else []))
