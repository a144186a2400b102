"""Incremental detokenization: text deltas that concatenate to exactly the reply's text, the full decode.

Each step decodes the whole reply (byte-level BPE decoding is cheap) and emits only text that can no
longer change: a trailing U+FFFD (a UTF-8 character still missing bytes) and the last
``len(longest stop string) - 1`` characters (a stop string may still be completing) are held back. A reply that
ends inside a character (cut by max_tokens) ends before it: the full decode's last U+FFFD, which stood for those
bytes, is no part of the text (its token ids stay).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


def make_decoder(tokenizer) -> Callable[[Sequence[int]], str]:
    """The fastest faithful decode: the Rust tokenizer when there is one, skipping special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(list(ids), skip_special_tokens=True)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character each byte is written as in a token, back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    return {c: b for b, c in chars.items()}


def make_tail_check(tokenizer) -> Callable[[Sequence[int]], bool]:
    """Whether token ids end inside a UTF-8 character (its first bytes decoded, the rest never came). Byte-level
    BPE tokenizers (SmolLM2, Llama 3, Qwen) give their tokens' bytes, read as the Rust decoder reads them; with any
    other tokenizer it answers False (a trailing U+FFFD stays in the text)."""
    from tokenizers import decoders

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return lambda ids: False
    alphabet, skipped = _byte_level_alphabet(), frozenset(tokenizer.all_special_ids)

    def token_bytes(token: str) -> bytes:  # (a token with a character outside the alphabet: its UTF-8, as Rust's)
        if all(c in alphabet for c in token):
            return bytes(alphabet[c] for c in token)
        return token.encode("utf-8")

    def ends_inside_a_character(ids: Sequence[int]) -> bool:
        tail = b""
        for token_id in reversed(ids):  # the last 4 bytes hold the start of the last character
            if token_id not in skipped and (token := backend.id_to_token(token_id)) is not None:
                tail = token_bytes(token) + tail
                if len(tail) >= 4:
                    break
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(tail, final=False)
        return bool(decoder.getstate()[0])  # the bytes it waits for: a character begun, not complete

    return ends_inside_a_character


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (),
                 ends_inside_a_character: Callable[[Sequence[int]], bool] = lambda ids: False):
        self._decode = decode
        self._ends_inside_a_character = ends_inside_a_character
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
        """At the end of the reply: everything not yet emitted, less a character that its tokens began and never
        finished (the U+FFFD that stood for its bytes, never emitted: push holds a trailing one back)."""
        if not self.stopped and self.text.endswith(REPLACEMENT) and self._ends_inside_a_character(self.token_ids):
            assert self.emitted < len(self.text)
            self.text = self.text[:-1]
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
