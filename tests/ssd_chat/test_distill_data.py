"""distill's reply cache: keyed by prompt, so a prompt file that grows (or an interrupted write) costs only the
missing replies; sampled replies are seeded by their prompt, not by its place in the file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import engine
from ssd_chat import distill_data as data
from ssd_chat.distill_config import DISTILL_PROMPTS
from ssd_chat.distill_prompts import split
from ssd_chat.prompts import load_prompts

MAX_TOKENS = 12


@pytest.fixture
def generated(monkeypatch) -> list[int]:
    """The number of prompts each LLM.generate call was given."""
    calls: list[int] = []
    original = engine.LLM.generate

    def counting(self, prompts, params=None, **kw):
        calls.append(len(prompts))
        return original(self, prompts, params, **kw)

    monkeypatch.setattr(engine.LLM, "generate", counting)
    return calls


def _settings(target: Path, temperature: float = 0.0, dtype: str = "float32") -> data.DataSettings:
    return data.DataSettings(str(target), "sha-of-the-prompt-file", MAX_TOKENS, temperature, 0, True, dtype)


def _examples(target: Path, prompts_path: Path, cache: Path, settings: data.DataSettings) -> list[data.Example]:
    return data.generate_examples(str(target), load_prompts(prompts_path), settings, cache, threads=1,
                                  progress=lambda done, total: None)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_grown_prompt_file_generates_only_the_new_replies(tiny_llama_dir, tmp_path, generated):
    lines = DISTILL_PROMPTS.read_text(encoding="utf-8").splitlines()[:8]
    cache = tmp_path / "data.jsonl"
    first = _examples(tiny_llama_dir, _write(tmp_path / "a.jsonl", lines[:5]), cache, _settings(tiny_llama_dir))
    assert generated == [5]
    grown = _examples(tiny_llama_dir, _write(tmp_path / "b.jsonl", lines), cache, _settings(tiny_llama_dir))
    assert generated == [5, 3]  # only the three new prompts
    assert grown[:5] == first
    assert len({e.prompt_ids for e in grown}) == 8 and all(len(e.reply_ids) == MAX_TOKENS for e in grown)
    again = _examples(tiny_llama_dir, _write(tmp_path / "c.jsonl", lines[3:] + lines[:3]), cache,
                      _settings(tiny_llama_dir))
    assert generated == [5, 3]  # reordered: every reply comes from the cache
    assert again == grown[3:] + grown[:3]
    other = _examples(tiny_llama_dir, tmp_path / "b.jsonl", cache, _settings(tiny_llama_dir, temperature=0.5))
    assert generated == [5, 3, 8]  # other reply settings: regenerated, never mixed in
    assert len(other) == 8
    assert _examples(tiny_llama_dir, tmp_path / "b.jsonl", cache, _settings(tiny_llama_dir)) == grown
    assert generated == [5, 3, 8]  # the first settings' replies were moved aside, not overwritten: back again
    assert _examples(tiny_llama_dir, tmp_path / "b.jsonl", cache, _settings(tiny_llama_dir, temperature=0.5)) == other
    assert generated == [5, 3, 8] and len(list(tmp_path.glob("data*.jsonl"))) == 2


def test_a_reply_cut_short_by_an_interruption_is_generated_again(tiny_llama_dir, tmp_path, generated):
    prompts = _write(tmp_path / "p.jsonl", DISTILL_PROMPTS.read_text(encoding="utf-8").splitlines()[:4])
    cache = tmp_path / "data.jsonl"
    whole = _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir))
    lines = cache.read_text(encoding="utf-8").splitlines()
    cache.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2], encoding="utf-8")
    assert _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir)) == whole
    assert generated == [4, 1]
    assert cache.read_text(encoding="utf-8").splitlines() == lines  # the torn line is gone, the reply rewritten
    cache.write_text("\n".join(lines), encoding="utf-8")  # a whole last line whose newline was never written
    assert _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir)) == whole
    assert generated == [4, 1, 1]  # dropped and written again after whole lines, not glued onto it
    assert cache.read_text(encoding="utf-8") == "".join(line + "\n" for line in lines)
    cache.write_text(lines[0], encoding="utf-8")  # interrupted right after the header, before its newline
    assert _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir)) == whole
    assert generated == [4, 1, 1, 4] and cache.read_text(encoding="utf-8").splitlines()[0] == lines[0]
    assert len(cache.read_text(encoding="utf-8").splitlines()) == 5


def test_sampled_replies_are_seeded_by_their_prompt_not_their_place(tiny_llama_dir, tmp_path):
    lines = DISTILL_PROMPTS.read_text(encoding="utf-8").splitlines()[:4]
    settings = _settings(tiny_llama_dir, temperature=1.0)
    forward = _examples(tiny_llama_dir, _write(tmp_path / "f.jsonl", lines), tmp_path / "f-cache.jsonl", settings)
    backward = _examples(tiny_llama_dir, _write(tmp_path / "b.jsonl", lines[::-1]), tmp_path / "b-cache.jsonl",
                         settings)
    assert backward == forward[::-1]
    seeds = {data.reply_seed(0, [1, 2, 3]), data.reply_seed(1, [1, 2, 3]), data.reply_seed(1, [1, 2, 4])}
    assert len(seeds) == 3


def test_bfloat16_replies_come_from_a_bfloat16_engine_and_never_mix_with_float32_ones(tiny_llama_dir, tmp_path,
                                                                                      generated, monkeypatch):
    dtypes: list[str] = []
    counting = engine.LLM.generate

    def recording(self, prompts, params=None, **kw):
        dtypes.append(self.config.dtype)
        return counting(self, prompts, params, **kw)

    monkeypatch.setattr(engine.LLM, "generate", recording)
    prompts = _write(tmp_path / "p.jsonl", DISTILL_PROMPTS.read_text(encoding="utf-8").splitlines()[:4])
    cache = tmp_path / "data.jsonl"
    fp32 = _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir))
    bf16 = _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir, dtype="bfloat16"))
    assert generated == [4, 4] and dtypes == ["float32", "bfloat16"]  # regenerated, not taken from the cache
    assert [e.prompt_ids for e in bf16] == [e.prompt_ids for e in fp32]
    assert all(len(e.reply_ids) == MAX_TOKENS for e in bf16)
    assert _examples(tiny_llama_dir, prompts, cache, _settings(tiny_llama_dir, dtype="bfloat16")) == bf16
    assert generated == [4, 4]  # the bfloat16 replies are cached under their own settings
    # a cache written before the dtype was recorded holds float32 replies, and is reused for them
    header = _settings(tiny_llama_dir).reply_settings()
    del header["dtype"]
    rows = [json.dumps({"prompt_ids": e.prompt_ids, "reply_ids": e.reply_ids}) for e in fp32]
    _write(tmp_path / "old.jsonl", [json.dumps(header), *rows])
    assert _examples(tiny_llama_dir, prompts, tmp_path / "old.jsonl", _settings(tiny_llama_dir)) == fp32
    assert generated == [4, 4]


def test_sampled_replies_of_the_rejection_sampler_are_not_taken_for_coupled_ones(tiny_llama_dir, tmp_path, generated):
    """A sampled cache written before the sampler was recorded holds the rejection sampler's draws: the coupled
    default regenerates its replies (a greedy one stays valid: the bfloat16 test above reuses one)."""
    prompts = _write(tmp_path / "p.jsonl", DISTILL_PROMPTS.read_text(encoding="utf-8").splitlines()[:3])
    sampled = _settings(tiny_llama_dir, temperature=0.8)
    assert sampled.sampler == "coupled" and sampled.reply_settings()["sampler"] == "coupled"
    assert "sampler" not in _settings(tiny_llama_dir).reply_settings()  # greedy: no matter
    coupled = _examples(tiny_llama_dir, prompts, tmp_path / "new.jsonl", sampled)
    assert generated == [3]
    header = sampled.reply_settings()
    del header["sampler"]
    rows = [json.dumps({"prompt_ids": e.prompt_ids, "reply_ids": e.reply_ids}) for e in coupled]
    _write(tmp_path / "old.jsonl", [json.dumps(header), *rows])
    assert _examples(tiny_llama_dir, prompts, tmp_path / "old.jsonl", sampled) == coupled  # (the same seeds)
    assert generated == [3, 3]  # generated again, not read from the old cache
    rejection = _examples(tiny_llama_dir, prompts, tmp_path / "r.jsonl", replace(sampled, sampler="rejection"))
    assert generated == [3, 3, 3] and rejection != coupled


def test_no_training_prompt_is_a_held_out_one():
    from ssd_chat.prompts import HELD_OUT_SETS

    training = {tuple(m["content"] for m in messages) for messages in load_prompts(DISTILL_PROMPTS)}
    for held_out in HELD_OUT_SETS:
        prompts = load_prompts(held_out)
        assert len(prompts) == 16
        assert not training & {tuple(m["content"] for m in messages) for messages in prompts}, held_out.name


def test_held_out_prompts_that_leave_less_than_a_batch_are_refused_before_any_reply(tiny_llama_dir, tmp_path,
                                                                                     monkeypatch):
    """`distill --eval-prompts 100000` generated replies to all 5,327 prompts (hours) to train on one (all but one
    held out), and `--max-prompts 4 --eval-prompts 10 --steps 2` trained on one reply, quietly."""
    from engine.errors import InvalidParameterError
    from ssd_chat.distill import DistillConfig, run_distill

    class Replies(Exception):
        """The run got past its checks: the replies would be generated now."""

    def fake_replies(*args, **kwargs):
        raise Replies

    monkeypatch.setattr(data, "generate_examples", fake_replies)

    def run(name: str, **kwargs) -> None:
        run_distill(DistillConfig(target=str(tiny_llama_dir), out=tmp_path / name, draft_layers=1, **kwargs),
                    lambda *_: None)

    def refused(**kwargs) -> str:
        with pytest.raises(InvalidParameterError) as err:
            run("refused", **kwargs)
        assert not (tmp_path / "refused").exists()  # nothing written
        return str(err.value)

    n = len(load_prompts(DISTILL_PROMPTS))
    more = "or give more prompts (--max-prompts, --prompts) or a smaller --batch-size"
    assert refused(eval_prompts=100_000) == (f"--eval-prompts 100,000 leaves 0 of the {n:,} prompts for training, "
                                             f"fewer than one batch (--batch-size 16): hold out at most {n - 16:,}, "
                                             + more)
    assert refused(max_prompts=4, eval_prompts=10, steps=2) == (
        "--eval-prompts 10 leaves 0 of the 4 prompts for training, fewer than one batch (--batch-size 16): hold out "
        "none (--eval-prompts 0), " + more)
    assert refused(max_prompts=4, eval_prompts=3, batch_size=2).startswith(
        "--eval-prompts 3 leaves 1 of the 4 prompts for training, fewer than one batch (--batch-size 2): hold out at "
        "most 2, ")
    assert len(split(load_prompts(DISTILL_PROMPTS, limit=20), 4)[0]) == 16  # one batch exactly: taken
    for name, kwargs in [("one batch left", dict(max_prompts=20, eval_prompts=4)), ("none held out",
                         dict(max_prompts=4, eval_prompts=0))]:  # (fewer prompts than a batch: the user's choice)
        with pytest.raises(Replies):
            run(name, **kwargs)
