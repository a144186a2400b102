"""Sampling through speculative decoding keeps the target's distribution (a chi-square test on a
small-vocabulary model), and a deliberately broken acceptance rule is caught by the same test."""

from __future__ import annotations

import itertools

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import engine.spec_decode
from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.sampling import race
from engine.sampling_params import SAMPLERS
from engine.speculative import Verdict

pytestmark = pytest.mark.slow  # 4000 requests a mode: minutes (test_spec_step_exact.py checks the step code in seconds)

VOCAB = ["<eos>", "a", "b", "c", "d", "e", "f", "g"]
PROMPT = [1, 2, 3]
TEMPERATURE = 0.9
NUM_TOKENS = 3  # compared: the first three tokens
MAX_TOKENS = 6  # generated: room for k = 3 drafts in the first verify step


def small_vocab_pair(root):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, eos_token_id=0,
                      bos_token_id=0, pad_token_id=0)
    dirs = []
    for name, seed in (("target", 3), ("draft", 4)):  # two unrelated models: q is far from p
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.5)
        model.save_pretrained(root / name)
        fast.save_pretrained(root / name)
        dirs.append(root / name)
    return tuple(dirs)


def exact_distribution(target_dir) -> dict[tuple[int, ...], float]:
    """P(first NUM_TOKENS tokens) under the target at TEMPERATURE, by enumeration."""
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    seqs = list(itertools.product(range(len(VOCAB)), repeat=NUM_TOKENS))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])  # [B, P + N]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits / TEMPERATURE, dim=-1)  # [B, P + N, V]
    rows = torch.arange(len(PROMPT) - 1, len(PROMPT) - 1 + NUM_TOKENS)
    picked = logp[:, rows].gather(-1, ids[:, len(PROMPT) :, None])[..., 0]  # [B, N]
    return {s: float(p) for s, p in zip(seqs, picked.sum(-1).exp(), strict=True)}


def chi_square(counts: dict, expected_p: dict, n: int) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom, pooling cells expected below 5 into one."""
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, p in expected_p.items():
        e, o = p * n, counts.get(cell, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        stat, dof = stat + (o - e) ** 2 / e, dof + 1
    if pooled_exp > 0:
        stat, dof = stat + (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9), dof + 1
    return stat, dof


def critical_value(dof: int) -> float:
    """Chi-square quantile for p = 1e-4 (Wilson-Hilferty approximation): false failures ~1 in 10,000 runs."""
    z = 3.719
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = small_vocab_pair(tmp_path_factory.mktemp("smallvocab"))
    return target, draft, exact_distribution(target)


# SSD's variants run a small fan-out: the default's dozen branches per request make 4000 requests slow (the
# branches are drawn row by row), and fewer branches leave both cache hits and misses to test (asserted below).
SMALL_FANOUT = {"fanout": (2, 1, 1, 1)}
VARIANTS = {  # mode name -> (engine mode, LLM options, SpeculationConfig options)
    "ar": ("ar", {}, {}), "sd": ("sd", {}, {}), "ssd": ("ssd", {}, SMALL_FANOUT),
    "ssd-fast-backup": ("ssd", {}, {"backup": "fast", **SMALL_FANOUT}),
    "ssd-draft-process": ("ssd", {"draft_device": "cpu", "threads": 1}, SMALL_FANOUT),
}


def sample_counts(target, draft, variant: str, n: int, sampler: str, *, check_both_paths: bool = True) -> dict:
    mode, options, spec = VARIANTS[variant]
    llm = LLM(str(target), draft=str(draft), speculation=SpeculationConfig(mode=mode, k=3, **spec), max_model_len=32,
              block_size=4, max_num_seqs=1024, kv_cache_tokens=1024 * 8, seed=11, **options)
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, ignore_eos=True, sampler=sampler)
    counts: dict[tuple[int, ...], int] = {}
    with llm:
        outs = llm.generate([PROMPT] * n, params)
    for out in outs:
        key = tuple(out.token_ids[:NUM_TOKENS])
        counts[key] = counts.get(key, 0) + 1
    if mode != "ar" and check_both_paths:  # the test means something only if drafts were accepted and rejected
        accepted = sum(o.stats.spec.num_accepted for o in outs)
        assert 0 < accepted < sum(o.stats.spec.num_drafted for o in outs)
    if mode == "ssd":  # ... and only if proposals came from both the cache and just-in-time drafting
        hits = sum(o.stats.spec.num_cache_hits or 0 for o in outs)  # (None: no round after the first drafted)
        drafted = sum(o.stats.spec.num_steps - o.stats.spec.num_plain_steps for o in outs)  # (SSD may pause: k = 0)
        assert 0 < hits < drafted  # hits, and misses (a request's first drafted round, at least)
    return counts


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("mode", list(VARIANTS))
def test_sampled_tokens_follow_the_target_distribution(pair, mode, sampler):
    target, draft, exact = pair
    # SSD's variants, 2000 requests: its batched branches cost 2.5x SD's steps here (a minute each at 4000 on a
    # slow CPU); they reuse SD's acceptance rule, which 4000 test, and check what SSD adds, the q rows of a hit.
    # Through a draft process, 1000: the same SSD, its rows carried by another process (a wrong row is no near miss)
    n = 4000 if VARIANTS[mode][0] != "ssd" else 1000 if mode == "ssd-draft-process" else 2000
    stat, dof = chi_square(sample_counts(target, draft, mode, n, sampler), exact, n)
    assert stat < critical_value(dof), (stat, dof)


def test_a_broken_acceptance_rule_is_caught(pair, monkeypatch):
    target, draft, exact = pair

    def accept_everything(draft_tokens, draft_probs, target_probs, generator):
        k = len(draft_tokens)
        return Verdict(k, int(torch.multinomial(target_probs[k], 1, generator=generator)))

    monkeypatch.setattr(engine.spec_decode, "verify_sampled", accept_everything)
    n = 4000
    stat, dof = chi_square(sample_counts(target, draft, "sd", n, "rejection", check_both_paths=False), exact, n)
    assert stat > critical_value(dof), (stat, dof)


def test_a_broken_coupled_verification_is_caught(pair, monkeypatch):
    target, draft, exact = pair

    def keep_everything(draft_tokens, target_probs, key, position):
        k = len(draft_tokens)
        return Verdict(k, race(target_probs[k], key, position + k))

    monkeypatch.setattr(engine.spec_decode, "verify_coupled", keep_everything)
    n = 4000
    stat, dof = chi_square(sample_counts(target, draft, "sd", n, "coupled", check_both_paths=False), exact, n)
    assert stat > critical_value(dof), (stat, dof)
