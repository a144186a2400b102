"""`ssd-chat distill` on a tiny random target: a loadable, exact draft that beats the untrained one, resumable,
one-line errors. The target's replies come from our engine; training runs a few hundred tiny steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.errors import InvalidParameterError, ModelFilesError
from ssd_chat import cli, distill
from ssd_chat.distill import DistillConfig, run_distill
from ssd_chat.distill_config import DISTILL_PROMPTS
from ssd_chat.distill_model import load_hf_draft
from ssd_chat.distill_prompts import held_out_indices
from ssd_chat.prompts import DEFAULT_PROMPTS, UNSEEN_PROMPTS, load_prompts

runner = CliRunner()
NUM_PROMPTS, MAX_TOKENS = 48, 48
TRAIN_ARGS = ["--draft-layers", "1", "--head-vocab", "200", "--batch-size", "4", "--lr", "3e-3", "--max-tokens",
              str(MAX_TOKENS), "--eval-prompts", "4", "--eval-every", "50", "--checkpoint-every", "100",
              "--kl-steps", "0"]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    lines = DISTILL_PROMPTS.read_text(encoding="utf-8").splitlines()[:NUM_PROMPTS]
    path = tmp_path_factory.mktemp("prompts") / "train.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _distill(target: Path, out: Path, prompts: Path, steps: int, *extra: str) -> None:
    args = ["distill", "--target", str(target), "--out", str(out), "--prompts", str(prompts), "--steps", str(steps),
            *TRAIN_ARGS, *extra]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def drafts(tiny_llama_dir, prompts_file, tmp_path_factory) -> tuple[Path, Path]:
    """(untrained, trained) drafts of the tiny target: the same architecture, 0 and 200 steps."""
    root = tmp_path_factory.mktemp("drafts")
    _distill(tiny_llama_dir, root / "untrained", prompts_file, 0)
    _distill(tiny_llama_dir, root / "trained", prompts_file, 200)
    return root / "untrained", root / "trained"


def _held_out_prompt_ids(llm: LLM, n: int) -> list[list[int]]:
    return [llm.encode_chat(messages) for messages in load_prompts(DEFAULT_PROMPTS, limit=n)]


def test_the_draft_loads_like_any_model_and_speculation_stays_exact(tiny_llama_dir, drafts):
    _, draft = drafts
    config = json.loads((draft / "config.json").read_text())
    assert config["reduced_head"] is True and config["embedding_from_target"] is True
    assert config["num_hidden_layers"] == 1 and not config["tie_word_embeddings"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (draft / name).read_bytes() == (tiny_llama_dir / name).read_bytes()
    saved = load_file(draft / "model.safetensors")  # compact: no embedding, 200 head rows and their token ids
    assert "model.embed_tokens.weight" not in saved
    head, scales, ids = saved["lm_head.weight"], saved["lm_head.weight_scale"], saved["lm_head.vocab_ids"]
    assert head.shape[0] == ids.shape[0] == scales.shape[0] == 200 and head.dtype == torch.int8
    assert torch.equal(ids, torch.unique(ids))  # sorted, distinct
    matmuls = [name for name, t in saved.items() if t.dim() == 2]  # every matmul weight in int8, the norms float16
    assert matmuls and all(saved[n].dtype == torch.int8 and f"{n}_scale" in saved for n in matmuls)
    assert all(t.dtype == torch.float16 for n, t in saved.items() if n.endswith("norm.weight"))

    hf = load_hf_draft(draft, tiny_llama_dir)  # transformers' view of it: the target's embedding, a full head
    target = load_file(tiny_llama_dir / "model.safetensors")
    assert torch.equal(hf.model.embed_tokens.weight, target["model.embed_tokens.weight"].float())
    assert torch.equal(hf.lm_head.weight[ids], head.float() * scales[:, None])
    assert int((hf.lm_head.weight.abs().amax(-1) > 0).sum()) == 200

    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(target=str(tiny_llama_dir), draft=str(draft), mode="ar")
    try:
        prompts = _held_out_prompt_ids(llm, 3)
        expected = [out.token_ids for out in llm.generate(prompts, greedy)]
        for mode in ("sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4)
            assert [out.token_ids for out in llm.generate(prompts, greedy)] == expected, mode
    finally:
        llm.close()


def _acceptance(target: Path, draft: Path) -> float:
    # a fixed k: the adaptive length follows measured costs, so the acceptance would depend on the machine's load
    llm = LLM(target=str(target), draft=str(draft), speculation=SpeculationConfig(mode="sd", k=4, adaptive_k=False))
    try:
        greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        outputs = [llm.generate(ids, greedy)[0] for ids in _held_out_prompt_ids(llm, 6)]
    finally:
        llm.close()
    return sum(out.stats.spec.acceptance_rate for out in outputs) / len(outputs)


def test_a_draft_without_its_target_or_with_corrupt_head_ids_is_one_line(tiny_llama_dir, drafts, tmp_path):
    _, draft = drafts
    result = runner.invoke(cli.app, ["ask", "hi", "--target", str(draft), "--max-tokens", "2"])
    assert result.exit_code == 2 and "borrows its target's input embedding" in result.stderr, result.output
    corrupt = tmp_path / "corrupt"
    shutil.copytree(draft, corrupt, ignore=shutil.ignore_patterns("distill"))
    tensors = load_file(corrupt / "model.safetensors")
    tensors["lm_head.vocab_ids"] = tensors["lm_head.vocab_ids"][:-1]  # one id short of the head's rows
    save_file(tensors, str(corrupt / "model.safetensors"))
    with pytest.raises(ModelFilesError, match="vocab_ids"):
        LLM(target=str(tiny_llama_dir), draft=str(corrupt))
    tensors = load_file(draft / "model.safetensors")
    del tensors["lm_head.weight_scale"]  # an int8 weight without its row scales
    save_file(tensors, str(corrupt / "model.safetensors"))
    with pytest.raises(ModelFilesError, match=r"has no lm_head\.weight_scale"):
        LLM(target=str(tiny_llama_dir), draft=str(corrupt))


def test_training_beats_the_untrained_draft(tiny_llama_dir, drafts):
    untrained, trained = drafts
    log = [json.loads(line) for line in (trained / "distill" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == list(range(201))
    assert log[0]["agreement"] < log[-1]["agreement"]  # on the held-out training prompts
    assert sum(r["loss"] for r in log[1:11]) > 2 * sum(r["loss"] for r in log[-10:])
    header, *rows = (json.loads(line) for line in (trained / "distill" / "data.jsonl").read_text().splitlines())
    assert header["ignore_eos"] is True  # the default: every reply runs to --max-tokens, past any end of turn
    assert {len(row["reply_ids"]) for row in rows} == {MAX_TOKENS}
    # On prompts it never saw (the benchmark set), the engine's SD acceptance at k = 4: 0.13 -> 0.20 here.
    before, after = _acceptance(tiny_llama_dir, untrained), _acceptance(tiny_llama_dir, trained)
    assert after > before + 0.05, (before, after)


class _Interrupt(Exception):
    pass


def _config(target: Path, prompts_file: Path, out: Path, **kw) -> DistillConfig:
    return DistillConfig(target=str(target), out=out, prompts_file=prompts_file, draft_layers=1, head_vocab=200,
                         batch_size=4, lr=3e-3, max_tokens=MAX_TOKENS, eval_prompts=4, eval_every=2,
                         checkpoint_every=3, **{"steps": 5, "kl_steps": 3} | kw)


def _same_weights(a: Path, b: Path) -> bool:
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tiny_llama_dir, prompts_file, tmp_path):
    def stop_at_step_7(phase: str, done: int, total: int, detail: str) -> None:
        if phase == "training" and done == 7:
            raise _Interrupt

    run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "whole"), lambda *_: None)
    with pytest.raises(_Interrupt):  # in the KL stage (steps 6-8), after its first checkpoint (step 6)
        run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "resumed"), stop_at_step_7)
    data = tmp_path / "resumed" / "distill" / "data.jsonl"
    cached = data.read_bytes()
    result = run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "resumed"), lambda *_: None)
    assert result.steps_run == 2  # from the checkpoint at step 6
    assert data.read_bytes() == cached  # the replies were not generated again
    assert _same_weights(tmp_path / "whole", tmp_path / "resumed")
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "distill" / "log.jsonl").open()]
    assert steps == list(range(9))  # step 7 was logged, dropped, and redone once
    moments = torch.load(tmp_path / "whole" / "distill" / "checkpoint.pt", weights_only=True)["optimizer"]["state"]
    assert {int(state["step"]) for state in moments.values()} == {3}  # AdamW restarted with the KL stage


def test_float16_storage_and_rewriting_a_finished_run_in_another_storage(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "draft"
    run_distill(_config(tiny_llama_dir, prompts_file, out, save_weights="float16"), lambda *_: None)
    saved = load_file(out / "model.safetensors")
    assert saved["lm_head.weight"].dtype == torch.float16 and not any(n.endswith("_scale") for n in saved)
    result = run_distill(_config(tiny_llama_dir, prompts_file, out), lambda *_: None)  # int8: not a new run
    assert result.steps_run == 0
    saved8 = load_file(out / "model.safetensors")
    q, scales = saved8["lm_head.weight"], saved8["lm_head.weight_scale"]
    assert q.dtype == torch.int8
    assert torch.allclose(q.float() * scales[:, None], saved["lm_head.weight"].float(), atol=scales.max().item())


def test_a_kl_stage_added_to_a_finished_run_continues_it(tiny_llama_dir, prompts_file, tmp_path):
    run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "both"), lambda *_: None)
    run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "later", kl_steps=0), lambda *_: None)
    assert not _same_weights(tmp_path / "both", tmp_path / "later")  # the KL steps change the draft
    result = run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "later"), lambda *_: None)
    assert result.steps_run == 3 and result.steps == 8
    assert _same_weights(tmp_path / "both", tmp_path / "later")
    with pytest.raises(InvalidParameterError, match="--kl-steps"):  # once in the KL stage, it is fixed
        run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "later", kl_steps=4), lambda *_: None)
    untrained = run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "none", steps=0), lambda *_: None)
    assert untrained.steps == 0 and untrained.steps_run == 0  # --steps 0: the untrained draft, no KL stage


def test_a_larger_steps_extends_a_run_until_its_kl_stage_begins(tiny_llama_dir, prompts_file, tmp_path):
    out, work = tmp_path / "run", tmp_path / "run" / "distill"
    run_distill(_config(tiny_llama_dir, prompts_file, out, steps=4, kl_steps=0), lambda *_: None)
    result = run_distill(_config(tiny_llama_dir, prompts_file, out, steps=6, kl_steps=0), lambda *_: None)
    assert result.steps_run == 2 and result.steps == 6
    assert json.loads((work / "settings.json").read_text())["extended_from"] == [4]
    rows = [json.loads(line) for line in (work / "log.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(7))
    fresh = run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "fresh", steps=6, kl_steps=0),
                        lambda *_: None)
    fresh_rows = [json.loads(line) for line in (tmp_path / "fresh" / "distill" / "log.jsonl").open()]
    assert rows[5]["lr"] == fresh_rows[5]["lr"] and rows[4]["lr"] != fresh_rows[4]["lr"]  # the 6-step schedule
    assert fresh.steps == 6 and not _same_weights(out, tmp_path / "fresh")  # from step 4 on
    run_distill(_config(tiny_llama_dir, prompts_file, out, steps=6, kl_steps=0), lambda *_: None)  # resumes
    assert json.loads((work / "settings.json").read_text())["extended_from"] == [4]  # kept
    with pytest.raises(InvalidParameterError, match="--steps"):  # fewer steps than it has
        run_distill(_config(tiny_llama_dir, prompts_file, out, steps=5, kl_steps=0), lambda *_: None)
    run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "kl", steps=2, kl_steps=2), lambda *_: None)
    with pytest.raises(InvalidParameterError, match="--steps"):  # its KL stage has run: the steps are fixed
        run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "kl", steps=4, kl_steps=2), lambda *_: None)


def test_a_held_out_prompts_twin_under_another_system_prompt_is_not_trained_on(tiny_llama_dir, prompts_file,
                                                                               tmp_path):
    lines = prompts_file.read_text(encoding="utf-8").splitlines()
    held_out = held_out_indices(len(lines), 4)
    assert 0 not in held_out
    turns = load_prompts(prompts_file)[held_out[0]]
    twin = json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                    *[m for m in turns if m["role"] != "system"]]})
    twinned = tmp_path / "twinned.jsonl"
    twinned.write_text("\n".join([twin, *lines[1:]]) + "\n", encoding="utf-8")  # line 0 is not held out
    plain = run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / "plain", steps=0), lambda *_: None)
    result = run_distill(_config(tiny_llama_dir, twinned, tmp_path / "twinned", steps=0), lambda *_: None)
    assert plain.num_examples == len(lines) - 4
    assert result.num_examples == len(lines) - 5  # the twin of a held-out prompt is dropped from training


def test_bf16_training_is_its_own_deterministic_run_and_auto_takes_it_where_the_cpu_has_it(
        tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    runs = {name: run_distill(_config(tiny_llama_dir, prompts_file, tmp_path / name, precision=precision, steps=8,
                                      kl_steps=2), lambda *_: None)
            for name, precision in (("fp32", "fp32"), ("bf16", "bf16"), ("bf16-again", "bf16"))}
    assert runs["bf16"].agreement is not None and runs["bf16"].final_loss is not None
    assert not _same_weights(tmp_path / "fp32", tmp_path / "bf16")  # the matmuls did run in bfloat16
    assert _same_weights(tmp_path / "bf16", tmp_path / "bf16-again")
    log = [json.loads(line) for line in (tmp_path / "bf16" / "distill" / "log.jsonl").open()]
    assert log[8]["loss"] < log[1]["loss"]  # the cross-entropy steps (9-10 are KL)
    monkeypatch.setattr(distill, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert distill.training_precision("auto") == "bf16" and distill.training_precision("fp32") == "fp32"
    monkeypatch.setattr(distill, "cpu_flags", lambda: frozenset({"avx512f", "avx2"}))  # bf16 emulated: slower
    assert distill.training_precision("auto") == "fp32" and distill.training_precision("bf16") == "bf16"


def test_bad_options_are_one_line_and_exit_2(tiny_llama_dir, prompts_file, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    base = ["distill", "--target", str(tiny_llama_dir), "--prompts", str(prompts_file)]
    trains = [*base, "--steps", "2", *TRAIN_ARGS]  # (the others would stop at the tiny target's layers too)
    cases = {
        "more layers than the target": [*base, "--out", str(tmp_path / "o1"), "--draft-layers", "3"],
        "unwritable out": [*base, "--out", str(a_file / "sub")],
        "out is a file": [*base, "--out", str(a_file)],
        "out holds other files": [*base, "--out", str(tmp_path / "busy")],
        "negative steps": [*base, "--out", str(tmp_path / "o2"), "--steps", "-1"],
        "seed past torch's range": [*trains, "--out", str(tmp_path / "o9"), "--seed", str(2**64)],
        "training on fewer than a batch": [*trains, "--out", str(tmp_path / "o12"), "--eval-prompts", "46"],  # (2 left)
        "unknown precision": [*base, "--out", str(tmp_path / "o5"), "--precision", "fp8"],
        "unknown reply dtype": [*base, "--out", str(tmp_path / "o7"), "--reply-dtype", "int4"],
        "unknown storage": [*base, "--out", str(tmp_path / "o8"), "--save-weights", "int4"],
        "training on the held-out set": [*base, "--out", str(tmp_path / "o3"), "--prompts", str(DEFAULT_PROMPTS)],
        "training on the unseen set": [*base, "--out", str(tmp_path / "o6"), "--prompts", str(UNSEEN_PROMPTS)],
        "missing target": ["distill", "--target", str(tmp_path / "nothing"), "--out", str(tmp_path / "o4")],
    }
    for case, args in cases.items():
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 2, (case, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, result.stderr)
        assert result.exception is None or isinstance(result.exception, SystemExit), case
    for option in ("--lr", "--kl-lr"):  # (inf trained NaNs): refused as typer reads it, as the other commands' are
        args = [*trains, "--out", str(tmp_path / "o10"), option, "inf"]
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 2 and result.stderr.startswith(f"error: {option} takes a number (ASCII digits")
    assert not (tmp_path / "o1").exists()  # nothing written for a refused run
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_resuming_with_other_settings_is_refused(tiny_llama_dir, prompts_file, tmp_path):
    _distill(tiny_llama_dir, tmp_path / "run", prompts_file, 2)
    result = runner.invoke(cli.app, ["distill", "--target", str(tiny_llama_dir), "--out", str(tmp_path / "run"),
                                     "--prompts", str(prompts_file), "--steps", "4", *TRAIN_ARGS, "--lr", "1e-3"])
    assert result.exit_code == 2
    assert "--lr" in result.stderr and "--no-resume" in result.stderr
    _distill(tiny_llama_dir, tmp_path / "run", prompts_file, 4, "--lr", "1e-3", "--no-resume")
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "distill" / "log.jsonl").open()]
    assert steps == list(range(5))
