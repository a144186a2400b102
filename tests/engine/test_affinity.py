"""Core affinity where the OS has none (macOS: no sched_getaffinity / sched_setaffinity): every core is usable,
a pin sets only the thread count, and engines with cpu:N placements still run and stay exact. Only this process
lacks the calls: SSD's draft process is a fresh interpreter (spawned) with the real os module, so its own pin is
Linux's."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

from engine import LLM, SamplingParams, affinity
from engine.config import DEFAULT_TARGET, SpeculationConfig
from engine.registry import SHIPPED_DRAFT_ALIAS
from ssd_chat.defaults import Layout, apply_defaults
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture
def no_affinity_calls(monkeypatch):
    """This process as on macOS: the os module without the affinity calls (restored after the test)."""
    threads = torch.get_num_threads()
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.delattr(os, "sched_setaffinity")
    affinity._cannot_pin.cache_clear()
    yield
    monkeypatch.undo()
    torch.set_num_threads(threads)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's affinity calls")
def test_linux_pins_and_reports_its_affinity():
    assert affinity.can_pin() and affinity.usable() == os.sched_getaffinity(0)


def test_without_affinity_calls_every_core_is_usable_and_a_pin_sets_threads(no_affinity_calls, caplog):
    assert not affinity.can_pin()
    assert affinity.usable() == set(range(os.cpu_count()))
    with caplog.at_level(logging.INFO, logger="engine.affinity"):
        affinity.pin({0}, 1)
        affinity.pin({0}, 1)
    assert torch.get_num_threads() == 1
    assert caplog.text.count("does not pin threads") == 1  # said once


def test_engines_run_exactly_without_affinity_calls(no_affinity_calls, tiny_llama_dir, tmp_path):
    draft = noisy_copy(tiny_llama_dir, tmp_path / "draft", scale=0.3)
    with LLM(str(tiny_llama_dir), max_model_len=256) as llm:
        ar = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=256, target_devices="cpu:0", threads=1) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ar
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=256, draft_device=f"cpu:{os.cpu_count() - 1}",
             speculation=SpeculationConfig(mode="ssd")) as llm:  # the leader's side of SSD
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ar


def test_the_embedded_pair_splits_the_cores_without_affinity_calls(no_affinity_calls):
    layout = apply_defaults(Layout(target=DEFAULT_TARGET, draft=None, mode="ssd"))
    assert layout.draft == SHIPPED_DRAFT_ALIAS
    if os.cpu_count() >= 2:  # SSD's draft process gets the last core, the target the others
        assert layout.draft_device == f"cpu:{os.cpu_count() - 1}" and layout.target_devices is not None

