"""A draft must tokenize exactly like its target: identical tokenizer files skip loading the draft's tokenizer
(startup.same_tokenizer_files), anything else is compared by the loaded vocabularies, and a mismatch is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine import LLM
from engine.errors import EngineError
from engine.startup import load_tokenizer, same_tokenizer_files


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _swap_two_ids(data: dict) -> None:
    """Two ordinary tokens trade ids: the same strings and size, other ids (merges still valid)."""
    vocab = data["model"]["vocab"]
    a, b = [t for t in vocab if t.isalpha() and len(t) > 2][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def test_identical_files_match_without_loading(tiny_llama_dir: Path, tmp_path: Path) -> None:
    twin = _copy(tiny_llama_dir, tmp_path / "twin")
    assert same_tokenizer_files(tiny_llama_dir, twin)
    # how a tokenizer was loaded is no part of its vocabulary
    _edit_json(twin / "tokenizer_config.json", lambda c: c.update(local_files_only=True, name_or_path="elsewhere"))
    assert same_tokenizer_files(tiny_llama_dir, twin)


def test_changed_files_do_not_match(tiny_llama_dir: Path, tmp_path: Path) -> None:
    renamed = _copy(tiny_llama_dir, tmp_path / "renamed")
    _edit_json(renamed / "tokenizer.json", _swap_two_ids)
    assert not same_tokenizer_files(tiny_llama_dir, renamed)
    added = _copy(tiny_llama_dir, tmp_path / "added")
    _edit_json(added / "tokenizer_config.json", lambda c: c.update(extra_special_tokens=["<|tool|>"]))
    assert not same_tokenizer_files(tiny_llama_dir, added)
    bare = _copy(tiny_llama_dir, tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    assert not same_tokenizer_files(tiny_llama_dir, bare)
    assert not same_tokenizer_files(bare, bare)  # no tokenizer.json: nothing said, the vocabularies decide


def test_a_draft_with_other_token_ids_is_refused(tiny_llama_dir: Path, tmp_path: Path) -> None:
    draft = _copy(tiny_llama_dir, tmp_path / "draft")
    _edit_json(draft / "tokenizer.json", _swap_two_ids)
    with pytest.raises(EngineError, match="use different tokenizers: pick a draft of the same model family"):
        LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=128, block_size=4)


def test_a_draft_with_reformatted_files_still_loads(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """Files that differ in bytes only (re-serialized JSON) fall back to comparing the vocabularies: accepted."""
    draft = _copy(tiny_llama_dir, tmp_path / "draft")
    _edit_json(draft / "tokenizer.json", lambda data: None)  # the same content, other whitespace
    assert not same_tokenizer_files(tiny_llama_dir, draft)
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=128, block_size=4) as llm:
        assert llm.draft_path == draft


def _alike(a, b) -> None:
    text = "Hi <|im_start|>there, 東京 😀\n  def f(x):"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    assert type(a) is type(b)
    assert a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id) == (b.eos_token_id, b.bos_token_id, b.pad_token_id)
    assert a(text)["input_ids"] == b(text)["input_ids"]
    assert a.apply_chat_template(messages, add_generation_prompt=True) == \
        b.apply_chat_template(messages, add_generation_prompt=True)
    ids = a(text)["input_ids"]
    assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_the_direct_load_is_what_auto_tokenizer_loads(fixture, request) -> None:
    """load_tokenizer skips AutoTokenizer for files naming TokenizersBackend: the same class and behaviour."""
    from transformers import AutoTokenizer

    path = request.getfixturevalue(fixture)
    assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    _alike(load_tokenizer(path), AutoTokenizer.from_pretrained(path))


def test_the_shipped_pair_loads_directly_as_auto_tokenizer_would() -> None:
    from transformers import AutoTokenizer

    from engine.registry import SHIPPED_DRAFT_DIR, resolve_model

    for path in (SHIPPED_DRAFT_DIR, resolve_model("smollm2-135m")):
        _alike(load_tokenizer(path), AutoTokenizer.from_pretrained(path))


def test_other_classes_go_through_auto_tokenizer(tiny_llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """A tokenizer_config naming another class (or code of its own) is AutoTokenizer's to resolve."""
    import transformers

    calls = []
    auto = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda p: calls.append(p) or auto(p))
    other = _copy(tiny_llama_dir, tmp_path / "other")
    _edit_json(other / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
    load_tokenizer(other)
    load_tokenizer(tiny_llama_dir)
    assert calls == [other]
