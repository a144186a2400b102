"""SSD's draft process starts before the target loads and loads its draft meanwhile (engine.startup); a start that
fails on either side leaves no process and no shared-memory block behind."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from engine import LLM, SamplingParams, startup
from engine.config import SpeculationConfig
from engine.distributed import RankSpec
from engine.draft_server import DraftSpec
from engine.errors import EngineError
from engine.remote_drafter import DraftLost, RemoteDrafter
from tests.engine.processes import DRAFT_CORE
from tests.engine.test_spec_decode import noisy_copy


@pytest.fixture(scope="module")
def draft_dir(tiny_llama_dir, tmp_path_factory):
    return noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("start") / "draft", scale=0.1, seed=5)


def _ranks() -> list[str]:
    return [p.name for p in multiprocessing.active_children() if p.name.startswith("ssd-chat-rank")]


def _blocks() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob(f"ssdchat_{os.getpid()}_*")} if shm.is_dir() else set()


def _llm(target: Path, draft: Path) -> LLM:
    return LLM(str(target), draft=str(draft), max_model_len=128, block_size=4, draft_device=DRAFT_CORE, threads=1)


def test_the_draft_process_is_up_while_the_target_loads(tiny_llama_dir, draft_dir, monkeypatch):
    seen: list[list[str]] = []
    build = startup.build_model

    def watched(*args, **kwargs):
        seen.append(_ranks())
        return build(*args, **kwargs)

    monkeypatch.setattr(startup, "build_model", watched)
    with _llm(tiny_llama_dir, draft_dir) as llm:
        assert seen == [["ssd-chat-rank1"]]  # started before the target's load, not after it
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        outputs = []
        for mode in ("ar", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3)
            outputs.append(llm.generate([[5, 6, 7, 8]], params)[0].token_ids)
        assert outputs[0] == outputs[1] and len(outputs[0]) == 16
        assert llm.remote is not None and llm.remote.alive
    assert _ranks() == []


def test_a_target_that_fails_to_load_stops_the_draft_process(tiny_llama_dir, draft_dir, monkeypatch):
    before = _blocks()

    def broken(*args, **kwargs):
        raise EngineError("the target did not load")

    monkeypatch.setattr(startup, "build_model", broken)
    with pytest.raises(EngineError, match="the target did not load"):
        _llm(tiny_llama_dir, draft_dir)
    assert _ranks() == []
    assert _blocks() == before


def test_a_draft_process_that_cannot_load_is_reported_and_gone(draft_dir, tmp_path):
    before = _blocks()
    spec = DraftSpec(str(tmp_path / "no-such-draft"), 16, 4, 128, 4, True, "auto", "cpu",
                     target_path=str(draft_dir))
    drafter = RemoteDrafter(spec, RankSpec(1, None, 1), timeout_s=30)
    with pytest.raises(DraftLost, match="the draft process did not start: ssd-chat-rank1 exited with code 1"):
        drafter.connect(vocab_size=384)
    assert not drafter.proc.is_alive() and not drafter.alive
    drafter.close()  # after a failed connect: nothing left to do, and no error
    assert _ranks() == []
    assert _blocks() == before
