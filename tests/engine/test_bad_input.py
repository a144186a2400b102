"""Every user mistake the engine can see becomes one EngineError line that says what to do."""

from __future__ import annotations

import json
import shutil

import pytest

from engine import LLM, EngineError, SamplingParams
from engine.config import EngineConfig, SpeculationConfig
from engine.errors import (
    InvalidParameterError,
    ModelFilesError,
    PromptTooLongError,
    UnknownModelError,
    UnsupportedArchitectureError,
)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir) -> LLM:
    return LLM(str(tiny_llama_dir), max_model_len=32, block_size=4)


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


def test_prompt_longer_than_context(llm):
    with pytest.raises(PromptTooLongError) as err:
        llm.generate([list(range(1, 40))], SamplingParams(temperature=0.0))
    assert "32" in one_line(err) and "max-model-len" in one_line(err)
    # the engine still works afterwards
    assert llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=2))[0].token_ids


def test_empty_prompt_and_bad_token_ids(llm):
    with pytest.raises(InvalidParameterError) as err:
        llm.generate([""], SamplingParams())
    one_line(err)
    with pytest.raises(InvalidParameterError) as err:  # (it said: must be a string or a list of token ids)
        llm.generate([[]], SamplingParams())
    assert "the prompt is empty" in one_line(err)
    with pytest.raises(InvalidParameterError) as err:
        llm.generate([[1, 10**6]], SamplingParams())
    assert "token ids" in one_line(err)
    with pytest.raises(InvalidParameterError) as err:  # (True is an int to Python: a torch error deep down)
        llm.generate([[True, False]], SamplingParams())
    assert "token ids" in one_line(err)


def test_bad_chat_messages(llm):
    with pytest.raises(InvalidParameterError):
        llm.encode_chat([])
    with pytest.raises(InvalidParameterError):
        llm.encode_chat([{"role": "robot", "content": "hi"}])


def test_unknown_alias_lists_the_aliases():
    with pytest.raises(UnknownModelError) as err:
        LLM("llama-9")
    assert "smollm2-135m" in one_line(err) and "qwen3-8b" in one_line(err)


def test_max_model_len_above_the_models_limit(tiny_llama_dir):
    with pytest.raises(InvalidParameterError) as err:
        LLM(str(tiny_llama_dir), max_model_len=10**6)
    one_line(err)


def test_unsupported_architecture(tiny_llama_dir, tmp_path):
    bad = tmp_path / "gpt2"
    shutil.copytree(tiny_llama_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError) as err:
        LLM(str(bad))
    assert "GPT2LMHeadModel" in one_line(err)


def test_corrupt_and_incomplete_weights(tiny_llama_dir, tmp_path):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_llama_dir, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelFilesError) as err:
        LLM(str(corrupt))
    assert "model.safetensors" in one_line(err)


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size"])
def test_a_config_of_other_sizes_than_the_weights(tiny_llama_dir, tmp_path, key):
    """config.json of another model than the weights (sizes changed): one line naming a tensor, not a traceback."""
    other = tmp_path / "other"
    shutil.copytree(tiny_llama_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg[key] *= 2
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFilesError) as err:
        LLM(str(other))
    assert "model.safetensors: tensor " in one_line(err) and "different models" in one_line(err)


def test_a_loading_failure_that_is_no_shape_mismatch_is_not_called_one(tiny_llama_dir, monkeypatch):
    from engine import loader

    def broken(param, tensor, shard_id):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(loader, "_copy_whole", broken)
    with pytest.raises(RuntimeError, match="not enough memory") as err:
        LLM(str(tiny_llama_dir))
    assert not isinstance(err.value, ModelFilesError)


def test_all_errors_are_engine_errors():
    for cls in (InvalidParameterError, ModelFilesError, PromptTooLongError, UnknownModelError):
        assert issubclass(cls, EngineError)


@pytest.mark.parametrize("kwargs", [
    {"threads": "2"}, {"tp": 1.5}, {"max_model_len": True}, {"block_size": 16.0}, {"device": 1}, {"target": 3},
    {"kv_cache_tokens": "lots"}, {"seed": 0.5}, {"draft_timeout_s": "soon"}, {"draft_timeout_s": 10**400},
    {"eager": "no"}, {"compile": None}, {"enable_prefix_caching": 1},
])
def test_engine_settings_of_the_wrong_type_are_one_line_errors(kwargs):
    """A value of the wrong type is refused by name, before anything loads (a string count or device failed with a
    TypeError or AttributeError inside the checks; tp=1.5 passed them)."""
    with pytest.raises(InvalidParameterError) as err:
        EngineConfig(**kwargs)
    assert one_line(err).startswith(next(iter(kwargs)) + " must be ")
    assert one_line(err).split(" must be ")[1].startswith(("a whole number", "a string", "a number", "True or False"))


@pytest.mark.parametrize("kwargs", [
    {"k": 2.5}, {"k": "3"}, {"fanout": [1.5]}, {"fanout": "3"}, {"draft_temperature": "hot"}, {"lookup": "no"},
    {"adaptive_k": None},
])
def test_speculation_settings_of_the_wrong_type_are_one_line_errors(kwargs):
    with pytest.raises(InvalidParameterError) as err:
        SpeculationConfig(**kwargs)
    assert one_line(err).startswith(next(iter(kwargs)) + " must be ")
    assert one_line(err).split(" must be ")[1].startswith(("a whole number", "a number", "a list", "True or False"))


def test_a_fanout_past_the_speculation_cache_is_a_one_line_error():
    """A fan-out of 2**63 or more was taken, and every SSD round then failed in the draft process's channel
    (OverflowError). No fan-out past MAX_FANOUT drafts more: a request's branches hold SCRATCH_SLOTS tokens, branches
    * k (engine.ssd drops the rest), so a larger one only ranked the whole vocabulary every round."""
    from engine.config import MAX_FANOUT, SCRATCH_SLOTS
    from engine.ssd import SCRATCH_SLOTS as SSD_SCRATCH_SLOTS

    assert MAX_FANOUT == SCRATCH_SLOTS == SSD_SCRATCH_SLOTS
    assert SpeculationConfig(mode="ssd", fanout=MAX_FANOUT).fanout == (MAX_FANOUT,)
    assert SpeculationConfig(mode="ssd", k=2, fanout=[0, MAX_FANOUT, 1]).fanout == (0, MAX_FANOUT, 1)
    for fanout, named in [(MAX_FANOUT + 1, MAX_FANOUT + 1), (2**63, 2**63), (10**20, 10**20),
                          ((1, 2, 2, 1, 10**20), 10**20)]:
        with pytest.raises(InvalidParameterError) as err:
            SpeculationConfig(mode="ssd", fanout=fanout)
        assert one_line(err) == (f"fanout must be at most {MAX_FANOUT} candidates per accepted count (SSD's "
                                 f"speculation cache holds {SCRATCH_SLOTS} branch tokens a request), got {named}")


def test_settings_take_numpy_numbers_paths_and_generators_as_plain_values(tiny_llama_dir):
    import numpy as np

    config = EngineConfig(target=tiny_llama_dir, threads=np.int32(2), max_model_len=np.int64(64))
    assert (config.target, config.threads, config.max_model_len) == (str(tiny_llama_dir), 2, 64)
    assert type(config.threads) is int and type(config.max_model_len) is int
    spec = SpeculationConfig(k=np.int64(3), fanout=(f for f in [1, 2, 3, 4]), draft_temperature=np.float32(0.5))
    assert (spec.k, spec.fanout, spec.draft_temperature) == (3, (1, 2, 3, 4), 0.5) and type(spec.k) is int
    assert SpeculationConfig(fanout=3).fanout == (3,)  # one number: every outcome's


def test_threads_past_what_openmp_starts_are_refused_in_one_line():
    # (--threads 20000: libgomp's "Thread creation failed"; 99999: a crash)
    with pytest.raises(InvalidParameterError, match="threads must be between 1 and 1024, got 20000"):
        EngineConfig(threads=20000)
    assert EngineConfig(threads=1024).threads == 1024
