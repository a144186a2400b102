"""End-to-end engine behaviour on tiny random models: exactness, prefix reuse, streaming, stops, cancel."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, FinishReason, RequestFinished, SamplingParams, TokenDelta
from engine.detokenizer import make_tail_check
from engine.errors import EngineError, InvalidParameterError

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir) -> LLM:
    return LLM(str(tiny_llama_dir), max_model_len=256, block_size=4)


def hf_greedy(path, prompt_ids: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    x = torch.tensor([prompt_ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, eos_token_id=None)
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_greedy_matches_transformers_generate(request, fixture):
    path = request.getfixturevalue(fixture)
    llm = LLM(str(path), max_model_len=256, block_size=8)
    prompts = [[5, 17, 42, 99, 7], list(range(30, 70))]
    outs = llm.generate(prompts, GREEDY)  # batched decode
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(path, prompt, GREEDY.max_tokens)
        assert out.finish_reason is FinishReason.LENGTH


def test_batched_equals_one_by_one(llm):
    prompts = ["The quick brown fox", "Paris is", [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    together = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert together == alone


def test_second_chat_turn_reuses_prefix_and_changes_nothing(tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    cached = LLM(str(tiny_llama_dir), max_model_len=256, block_size=4)
    uncached = LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, enable_prefix_caching=False)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox"}]
    first = _final(cached.chat(history, params))
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Paris is"}]
    before = cached.num_forward_tokens
    second = _final(cached.chat(history, params))
    computed = cached.num_forward_tokens - before
    reference = _final(uncached.chat(history, params))
    assert second.token_ids == reference.token_ids
    assert second.stats.reused_prefix_tokens > 0
    assert reference.stats.reused_prefix_tokens == 0
    # only the new prompt tokens and the decode steps went through the model
    assert computed == second.stats.prompt_tokens - second.stats.reused_prefix_tokens + params.max_tokens - 1
    assert second.stats.prefill_tokens == second.stats.prompt_tokens - second.stats.reused_prefix_tokens


def test_streamed_deltas_concatenate_to_the_full_text(llm):
    for seed in range(6):  # hot sampling emits random byte tokens: split multi-byte characters
        params = SamplingParams(temperature=3.0, max_tokens=40, seed=seed, ignore_eos=True)
        events = list(llm.stream("Ünïcödé 東京", params))
        assert isinstance(events[-1], RequestFinished)
        out = events[-1].output
        deltas = [e for e in events if isinstance(e, TokenDelta)]
        assert "".join(d.text for d in deltas) == out.text
        assert [t for d in deltas for t in d.token_ids] == out.token_ids
        full = llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        cut = make_tail_check(llm.tokenizer)(out.token_ids)  # the length limit cut a character: less its U+FFFD
        assert out.text == (full[:-1] if cut else full) and (not cut or full.endswith("\ufffd"))


def test_multibyte_character_is_held_until_complete(llm):
    from engine.detokenizer import IncrementalDetokenizer, make_decoder

    ids = llm.tokenizer.convert_tokens_to_ids(list("ðŁĺĢ"))  # the four byte tokens of 😀
    detok = IncrementalDetokenizer(make_decoder(llm.tokenizer))
    pieces = [detok.push([i]) for i in ids]
    assert pieces == ["", "", "", "😀"]


def test_a_reply_cut_inside_a_character_ends_before_it(tiny_llama_dir):
    """The model made to write byte F0 (a 4-byte character's first) again and again: each F0 after another is an
    invalid byte, a U+FFFD in the text; the last, cut by max_tokens, is no part of it (its token id stays)."""
    # the head is edited in place below, which packed weight copies (engine.layers.packed) would not see
    llm = LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, packed_weights=False)
    lead = llm.tokenizer.convert_tokens_to_ids("ð")
    with torch.no_grad():
        head = llm.core.runner.model.lm_head.weight
        head[lead] = head.abs().max() * 50 * torch.sign(llm.core.runner.model.model.norm.weight)
    events = list(llm.stream("Paris", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
    out = events[-1].output
    assert out.token_ids[1:] == [lead] * 3  # (the first, the prefill step's, need not follow the edit)
    full = llm.tokenizer.decode(out.token_ids)
    assert full.endswith("\ufffd" * 3) and out.text == full[:-1]
    assert "".join(e.text for e in events if isinstance(e, TokenDelta)) == out.text


def test_seeded_sampling_is_reproducible(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=20, seed=123, ignore_eos=True)
    a = llm.generate(["Paris is"], params)[0].token_ids
    b = llm.generate(["Paris is"], params)[0].token_ids
    c = llm.generate(["Paris is"], SamplingParams(temperature=1.0, max_tokens=20, seed=7, ignore_eos=True))[0]
    assert a == b
    assert a != c.token_ids


def test_generate_takes_one_params_per_prompt(llm):
    def sampled(seed):
        return SamplingParams(temperature=1.0, max_tokens=12, seed=seed, ignore_eos=True)

    together = [o.token_ids for o in llm.generate(["Paris is"] * 2, [sampled(1), sampled(2)])]
    assert together == [llm.generate(["Paris is"], sampled(s))[0].token_ids for s in (1, 2)]
    assert together[0] != together[1]
    with pytest.raises(InvalidParameterError, match="one per prompt"):
        llm.generate(["a", "b"], [sampled(1)])


def test_stop_string_stop_token_and_max_tokens(llm):
    free = llm.generate(["The quick"], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0]
    assert len(free.token_ids) == 30 and free.finish_reason is FinishReason.LENGTH
    stop = free.text[5:8]
    cut = llm.generate(["The quick"], SamplingParams(temperature=0.0, max_tokens=30, stop=[stop], ignore_eos=True))[0]
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == free.text[: free.text.index(stop)]
    stop_id = free.token_ids[6]
    by_id = llm.generate(["The quick"], SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop_id]))[0]
    assert by_id.token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1]
    assert by_id.finish_reason is FinishReason.STOP


def test_eos_ends_the_reply_unless_ignored(tiny_llama_dir):
    # the head is edited in place below, which packed weight copies (engine.layers.packed) would not see
    llm = LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, packed_weights=False)
    eos = llm.tokenizer.eos_token_id
    with torch.no_grad():  # make the model always predict EOS by biasing the head
        head = llm.core.runner.model.lm_head.weight
        saved = head[eos].clone()
        head[eos] = head.abs().max() * 50 * torch.sign(llm.core.runner.model.model.norm.weight)
    try:
        out = llm.generate(["Paris"], SamplingParams(temperature=0.0, max_tokens=10))[0]
        assert out.token_ids[-1] == eos and out.finish_reason is FinishReason.STOP
        assert len(out.token_ids) < 10 and out.text.count("<|im_end|>") == 0
        ignored = llm.generate(["Paris"], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
        assert len(ignored.token_ids) == 10
    finally:
        with torch.no_grad():
            head[eos] = saved


def test_context_limit_ends_generation(tiny_llama_dir):
    small = LLM(str(tiny_llama_dir), max_model_len=20, block_size=4)
    out = small.generate([list(range(1, 16))], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason is FinishReason.CONTEXT
    assert len(out.prompt_token_ids) + len(out.token_ids) == 20


def test_closing_a_stream_frees_its_blocks(llm):
    total = llm.core.blocks.num_free_blocks
    stream = llm.stream("The quick brown fox", SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    first = next(stream)
    assert isinstance(first, TokenDelta)
    assert llm.core.blocks.num_free_blocks < total
    stream.close()
    assert llm.core.blocks.num_free_blocks == total
    assert not llm.core.has_work


def test_cancel_event_ends_the_stream_with_partial_output(llm):
    cancel = threading.Event()
    events = []
    for event in llm.stream("Paris is", SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True), cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    out = events[-1].output
    assert out.finish_reason is FinishReason.CANCELLED
    assert len(out.token_ids) == 3
    assert llm.core.blocks.num_free_blocks == len(llm.core.blocks.blocks)


def test_close_from_another_thread_waits_for_the_step_and_cancels(tiny_llama_dir):
    """The chat app closes the engine from its UI thread while a reply may be mid-step on a worker: close waits
    for that step, then the reply ends as cancelled, with no error in either thread."""
    llm = LLM(str(tiny_llama_dir), threads=1)
    started, stepping, outcome = threading.Event(), threading.Event(), []
    step = llm.core.step

    def slow_step():  # the first step holds until close() has begun
        started.set()
        stepping.wait(5)
        return step()

    llm.core.step = slow_step

    def reply() -> None:
        try:
            outcome.append(list(llm.stream("Paris is", SamplingParams(temperature=0.0, max_tokens=50,
                                                                       ignore_eos=True)))[-1].output)
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=reply)
    worker.start()
    started.wait(5)
    threading.Timer(0.2, stepping.set).start()
    llm.close()  # waits for the step under way
    worker.join(10)
    assert len(outcome) == 1 and getattr(outcome[0], "finish_reason", None) is FinishReason.CANCELLED, outcome
    with pytest.raises(EngineError, match="closed"):
        llm.generate("more", SamplingParams(temperature=0.0, max_tokens=2))


def _final(events):
    *_, last = events
    assert isinstance(last, RequestFinished)
    return last.output


def test_sharded_checkpoint_loads_like_a_single_file(tiny_llama_dir, tmp_path):
    from transformers import AutoTokenizer

    sharded = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    model.save_pretrained(sharded, max_shard_size="50KB")
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(sharded)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    one = LLM(str(tiny_llama_dir), max_model_len=64).generate([[3, 4, 5]], params)[0].token_ids
    many = LLM(str(sharded), max_model_len=64).generate([[3, 4, 5]], params)[0].token_ids
    assert one == many


def test_text_that_is_not_utf8_is_one_line_error(llm):
    with pytest.raises(InvalidParameterError, match="not valid UTF-8") as err:
        llm.generate("bad \udcff bytes", SamplingParams(temperature=0.0, max_tokens=2))
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidParameterError, match="not valid UTF-8"):
        list(llm.chat([{"role": "user", "content": "caf\udce9"}], SamplingParams(temperature=0.0, max_tokens=2)))


def test_unseeded_sampling_draws_afresh_in_every_engine(tiny_llama_dir):
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    replies = []
    for _ in range(3):
        with LLM(str(tiny_llama_dir), threads=1) as engine:
            replies.append(tuple(engine.generate("Paris is", params)[0].token_ids))
    assert len(set(replies)) > 1
    seeded = []
    for _ in range(2):
        with LLM(str(tiny_llama_dir), threads=1, seed=5) as engine:
            seeded.append(engine.generate("Paris is", params)[0].token_ids)
    assert seeded[0] == seeded[1]  # EngineConfig.seed keeps the old reproducible behaviour


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_weight_bytes_counts_one_row_of_an_untied_input_embedding(request, fixture):
    """The bench's bandwidth bound divides by the bytes a decode step reads: an untied input embedding gives one
    row a token (the whole table had been counted); a tied one is the head's, read whole."""
    with LLM(str(request.getfixturevalue(fixture)), threads=1, packed_kernel="panel") as llm:
        model = llm.core.runner.model
        params = {id(p): p for p in model.parameters()}
        embedding = model.model.embed_tokens.weight
        tied = embedding is model.lm_head.weight
        row = embedding.shape[1] * embedding.element_size()
        whole = sum(p.numel() * p.element_size() for p in params.values())
        assert tied == (fixture == "tiny_qwen3_dir")
        assert llm.weight_bytes == (whole if tied else whole - embedding.numel() * embedding.element_size() + row)


@pytest.mark.parametrize("sampler", ["coupled", "rejection"])
def test_a_sampled_reply_says_its_seed_and_the_seed_gives_it_again(llm, sampler):
    """An unseeded sampled request samples from a seed the engine draws; its stats say which, so that the reply can
    be had again (the chat's /seed, the export's settings cell)."""
    prompt = llm.tokenizer.encode("Once upon a time")
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, sampler=sampler)
    first, second = (llm.generate([prompt], params)[0] for _ in range(2))
    assert first.stats.seed is not None and first.stats.seed != second.stats.seed
    again = llm.generate([prompt], replace(params, seed=first.stats.seed))[0]
    assert again.token_ids == first.token_ids and again.stats.seed == first.stats.seed
    assert llm.generate([prompt], replace(params, seed=7))[0].stats.seed == 7
    assert llm.generate([prompt], replace(params, temperature=0.0))[0].stats.seed is None  # greedy: none
    assert first.to_dict()["stats"]["seed"] == first.stats.seed


def test_a_chat_reply_continued_goes_on_from_its_last_token(llm):
    """continue_reply: the last message, an assistant reply, stays open (no end of turn), so the model goes on with
    it (a reply the length limit cut): the prompt is the question's, then the reply's tokens, and the reply goes on
    exactly as from those tokens."""
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    question = [{"role": "user", "content": "Paris is"}]
    cut = "The quick brown fox"
    conversation = [*question, {"role": "assistant", "content": cut}]
    prompt = llm.encode_chat(conversation, continue_reply=True)
    assert prompt == llm.encode_chat(question) + llm.tokenizer.encode(cut)  # (no end of turn, no new turn opened)
    events = list(llm.chat(conversation, greedy, continue_reply=True))
    assert list(events[-1].output.token_ids) == list(llm.generate(prompt, greedy)[0].token_ids)
    assert llm.encode_chat(conversation) != prompt  # (without it: the reply closed, a new one opened)
    with pytest.raises(InvalidParameterError, match="continue_reply needs a conversation that ends with an assistant"):
        llm.encode_chat(question, continue_reply=True)


def test_a_chat_template_that_cannot_continue_a_reply_is_an_invalid_parameter(llm, monkeypatch):
    """A template that rewrites the last message (Qwen3's rebuilds its thinking block): transformers' ValueError
    was an engine failure in the app ("the engine failed"); it is the request's error."""
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "lower case"}]
    with pytest.raises(InvalidParameterError, match="chat template cannot continue this reply"):
        llm.encode_chat(conversation, continue_reply=True)
