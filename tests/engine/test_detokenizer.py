"""The streaming detokenizer on a real byte-level BPE tokenizer (tests.conftest): the deltas concatenate to the
reply's text, and a reply that ends inside a character ends before it, while a U+FFFD the model wrote stays."""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer, make_decoder, make_tail_check
from tests.conftest import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _reply(tokenizer, ids: list[int], stop: tuple[str, ...]) -> str:
    """The text of a reply streamed a token at a time, checked against its deltas."""
    detok = IncrementalDetokenizer(make_decoder(tokenizer), stop, make_tail_check(tokenizer))
    deltas = [detok.push([i]) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.text
    return detok.text


@pytest.mark.parametrize("stop", [(), ("zz",)], ids=["no stop string", "a stop string held back"])
def test_a_reply_cut_inside_a_character_ends_before_it_and_a_written_replacement_stays(tokenizer, stop):
    hi, smile = tokenizer.encode("Hi "), tokenizer.convert_tokens_to_ids(list("ðŁĺĢ"))  # 😀's four bytes
    for n in (1, 2, 3):
        assert tokenizer.decode(hi + smile[:n]) == "Hi \ufffd"
        assert _reply(tokenizer, hi + smile[:n], stop) == "Hi "
    assert _reply(tokenizer, smile[:2], stop) == ""
    assert _reply(tokenizer, hi + smile[:1] + smile[:1], stop) == "Hi \ufffd"  # F0 F0: the first is invalid
    assert _reply(tokenizer, hi + smile, stop) == "Hi 😀"
    # a U+FFFD that is no character cut short stays
    assert _reply(tokenizer, tokenizer.encode("a\ufffd"), stop) == "a\ufffd"  # U+FFFD's own bytes, EF BF BD
    assert _reply(tokenizer, hi + smile[1:2], stop) == "Hi \ufffd"  # a stray continuation byte: no character begun
    assert _reply(tokenizer, hi + smile[:2] + tokenizer.encode("b"), stop) == "Hi \ufffdb"  # mid-text
