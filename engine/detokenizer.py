"""Incremental detokenization: text deltas that concatenate to exactly the full decode.

Each step decodes the whole reply (byte-level BPE decoding is cheap) and emits only text that can no
longer change: a trailing U+FFFD (a UTF-8 character still missing bytes) and the last
``len(longest stop string) - 1`` characters (a stop string may still be completing) are held back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


def make_decoder(tokenizer) -> Callable[[Sequence[int]], str]:
    """The fastest faithful decode: the Rust tokenizer when there is one, skipping special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(list(ids), skip_special_tokens=True)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""        # the reply so far (cut before a stop string once one matched)
        self.emitted = 0      # characters of `text` already handed out
        self.stopped = False  # a stop string matched

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stop)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the newly final text (possibly "")."""
        assert not self.stopped
        self.token_ids.extend(token_ids)
        self.text = self._decode(self.token_ids)
        if self._stop:
            cut = self._find_stop(max(0, self.emitted - self._hold))
            if cut is not None:
                self.text, self.stopped = self.text[:cut], True
                return self._emit(cut)
        end = len(self.text) - self._hold
        while end > self.emitted and self.text[end - 1] == REPLACEMENT:
            end -= 1
        return self._emit(end)

    def flush(self) -> str:
        """At the end of the reply: everything not yet emitted."""
        return self._emit(len(self.text))

    def _find_stop(self, start: int) -> int | None:
        hits = [i for s in self._stop if (i := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _emit(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        delta, self.emitted = self.text[self.emitted : end], end
        return delta


def check_same_tokenizer(target_tokenizer, draft_tokenizer, *, target: str, draft: str) -> None:
    """Speculation compares token ids, so the draft must tokenize exactly like the target."""
    from engine.errors import EngineError

    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise EngineError(
            f"draft {draft} and target {target} use different tokenizers: pick a draft of the same model family"
        )
