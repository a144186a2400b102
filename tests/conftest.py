"""Shared fixtures: tiny random Llama-3 / Qwen3 model directories with a real byte-level BPE tokenizer.

Nothing here touches the network: HF_HUB_OFFLINE is forced on for the whole test session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one torch thread each
    import torch

    torch.set_num_threads(1)
    # and one in each process a test starts (the CLI, an engine or draft process, a script) unless it asks for more:
    # two OpenMP threads spinning on a core the other worker holds made a tiny training run 4x slower
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _one_thread_each_test():
    """Under xdist, every test starts on one torch thread: one that left two (torch.set_num_threads is the
    process's) made the next engine with threads=None step on two, with a thread governor whose note, on a busy CI
    machine, landed in another test's expected stderr."""
    yield
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path_factory, monkeypatch):
    """Every test's chat history and preferences in a folder of its own, never the user's (an app with no store
    reads its preferences from the data folder)."""
    monkeypatch.setenv("SSD_CHAT_DATA", str(tmp_path_factory.mktemp("data")))


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "Paris is the capital of France; Berlin is the capital of Germany. Ünïcödé: 東京, 😀 emoji!",
    "def add(a, b):\n    return a + b\n",
] * 8


def build_tokenizer(vocab_size: int = 384):
    """A real byte-level BPE tokenizer (trained in about a second) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def make_tiny_model_dir(
    root: Path,
    *,
    family: str = "llama",
    tied: bool = False,
    rope_scaling: bool = False,
    num_layers: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 512,
    head_dim: int | None = None,
) -> Path:
    """Save a tiny random model of `family` ("llama" | "qwen3") in Hugging Face layout under `root`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling:
        rope = {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        }
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope, head_dim=head_dim or 16))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32, rope_parameters=rope))
    else:
        raise ValueError(family)
    # Random init uses std 0.02: logits would be nearly flat. Scale up so greedy choices are decisive.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15 if "embed" not in name else 1.0)
    out = root / f"tiny-{family}{'-tied' if tied else ''}{'-rope' if rope_scaling else ''}{head_dim or ''}-{seed}"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("models"), family="llama")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("models"), family="qwen3", tied=True)


@pytest.fixture(scope="session")
def wide_heads_dir(tmp_path_factory) -> Path:
    """A tiny Llama whose heads are 64 wide, as real models' are (layer.cpp's rotary takes whole vectors: head_dim
    a multiple of 32; torch's SDPA kernel takes them)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("wide"), family="llama", head_dim=64)


@pytest.fixture(scope="session", autouse=True)
def no_orphan_ranks():
    """After the whole session, no draft or TP rank process may still be running."""
    import multiprocessing

    yield
    left = [p.name for p in multiprocessing.active_children() if p.name.startswith("ssd-chat-rank")]
    assert not left, f"rank processes left running: {left}"
