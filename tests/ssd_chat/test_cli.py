"""The `ssd-chat` CLI on a tiny random model: output matches the engine, user errors are one line + exit 2."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from engine import LLM
from engine.registry import ALIASES
from ssd_chat import cli
from ssd_chat.prompts import BenchInputError, load_prompts
from tests.ssd_chat.cli_runs import REPO_ROOT, greedy_chat, run_ssd_chat

runner = CliRunner()


def test_a_draft_process_start_prints_nothing_but_the_reply(tiny_llama_dir):
    """torch's C++ rendezvous warnings (c10d socket timeouts while the draft process starts) stay hidden."""
    tiny = str(tiny_llama_dir)
    result = run_ssd_chat("ask", "Paris is", "--target", tiny, "--draft", tiny, "--mode", "ssd", "--draft-device",
                          "cpu", "--temperature", "0", "--max-tokens", "4")
    assert result.returncode == 0, result.stderr
    assert "c10d" not in result.stderr and "socket" not in result.stderr, result.stderr


def test_models_lists_every_alias():
    result = runner.invoke(cli.app, ["models"])
    assert result.exit_code == 0, result.output
    for alias, spec in ALIASES.items():
        assert alias in result.stdout
        assert spec.family in result.stdout


def test_ask_streams_the_greedy_reply(tiny_llama_dir):
    expected = greedy_chat(tiny_llama_dir, "Paris is", 8)
    args = ["ask", "Paris is", "--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "8"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"

    result = runner.invoke(cli.app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"text", "token_ids", "finish_reason", "stats"}
    assert payload["token_ids"] == list(expected.token_ids)
    assert payload["text"] == expected.text
    assert payload["finish_reason"] == str(expected.finish_reason)
    assert payload["stats"]["generated_tokens"] == len(expected.token_ids)


def test_ask_prefills_in_the_chunks_it_is_given(tiny_llama_dir, monkeypatch):
    expected = greedy_chat(tiny_llama_dir, "Paris is a city of lights and of long walks by the river", 6)
    made = []

    def recording_llm(**kwargs):
        made.append(LLM(**kwargs))
        return made[-1]

    monkeypatch.setattr(cli, "LLM", recording_llm)
    args = ["ask", "Paris is a city of lights and of long walks by the river", "--target", str(tiny_llama_dir),
            "--temperature", "0", "--max-tokens", "6", "--prefill-chunk", "4"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"
    assert made[0].core.prefill_chunk == 4


def test_ask_says_on_stderr_when_the_context_limit_cut_the_reply(tiny_llama_dir):
    """`ask --max-model-len 64 --max-tokens 1000` stopped mid-sentence with rc 0 and nothing on stderr (only --json
    said finish_reason "context"). One line on stderr now says so and what to do; stdout keeps only the reply."""
    ask = ["ask", "Paris is", "--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "1000"]
    notice = "(the reply stopped at the context limit of {} tokens: {}shorten the prompt)\n"
    cut = runner.invoke(cli.app, [*ask, "--max-model-len", "32"])  # (the tiny model never ends a reply)
    as_json = runner.invoke(cli.app, [*ask, "--max-model-len", "32", "--json"])
    assert cut.exit_code == as_json.exit_code == 0, cut.output
    assert json.loads(as_json.stdout)["finish_reason"] == "context"
    assert cut.stdout == json.loads(as_json.stdout)["text"] + "\n"
    assert cut.stderr == as_json.stderr == notice.format(32, "raise --max-model-len (up to 512), or ")
    own = runner.invoke(cli.app, ask)  # the model's own context (512): no larger one to ask for
    assert own.exit_code == 0 and own.stderr == notice.format(512, "")
    whole = runner.invoke(cli.app, [*ask[:-1], "8", "--max-model-len", "32"])  # not cut: nothing on stderr
    assert whole.exit_code == 0 and whole.stderr == ""


def test_ask_reads_the_prompt_from_stdin(tiny_llama_dir):
    expected = greedy_chat(tiny_llama_dir, "Paris is", 5)
    args = ["ask", "-", "--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "5", "--json"]
    result = runner.invoke(cli.app, args, input="Paris is\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token_ids"] == list(expected.token_ids)


@pytest.mark.parametrize(
    "case",
    ["unknown alias", "missing directory", "negative temperature", "prompt too long", "bad option value",
     "REPL option before a command", "weights missing offline", "unsupported architecture", "corrupt weights",
     "missing tokenizer", "core that does not exist", "more TP ranks than cores", "bad device syntax",
     "unknown draft weights", "unknown cpu matmul", "prompt not UTF-8", "draft that is no model", "empty prompt",
     "bench json in a missing directory", "bench json a directory", "prompt file not UTF-8", "unknown bench mode",
     "bench sd with no draft",
     "distill target that is no model", "backwards core range", "seed out of range", "bench unknown model",
     "distill target that is a draft", "distill out is a file", "prefill chunk of zero", "unknown kv dtype",
     "distill on a held-out set under another name", "unknown enter mode", "verbose after a command",
     "fanout past the speculation cache"],
)
def test_user_errors_are_one_line_and_exit_2(case, tiny_llama_dir, tmp_path):
    tiny = str(tiny_llama_dir)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    if case == "unsupported architecture":
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps({**config, "architectures": ["MambaForCausalLM"]}))
    elif case == "corrupt weights":
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    elif case == "missing tokenizer":
        (broken / "tokenizer.json").unlink()
        (broken / "tokenizer_config.json").unlink()
    (tmp_path / "empty").mkdir()
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    (tmp_path / "mine.jsonl").write_text("A prompt of my own\n" + (REPO_ROOT / "assets/prompts/chat.jsonl").read_text())
    bench = ["bench", "--target", tiny, "--max-tokens", "2", "--limit", "1"]
    args = {
        "prompt not UTF-8": ["ask", "bad \udcff\udcfe bytes", "--target", tiny],  # argv bytes b"\xff\xfe"
        "draft that is no model": ["ask", "hi", "--target", tiny, "--draft", str(tmp_path / "empty")],
        "empty prompt": ["ask", "  ", "--target", tiny],
        "bench json in a missing directory": [*bench, "--json", str(tmp_path / "no" / "such" / "b.json")],
        "bench json a directory": [*bench, "--json", str(tmp_path)],
        "prompt file not UTF-8": [*bench, "--prompts", str(tmp_path / "latin1.txt")],
        "unknown bench mode": [*bench, "--modes", "xx"],
        "bench sd with no draft": [*bench, "--modes", "sd", "--draft", "none"],  # ("none": no draft, as in the chat)
        "distill target that is no model": ["distill", "--target", str(tmp_path / "empty"), "--out",
                                            str(tmp_path / "d")],
        "backwards core range": ["ask", "hi", "--target", tiny, "--target-devices", "cpu:1-0"],
        "seed out of range": ["ask", "hi", "--target", tiny, "--seed", str(2**70)],
        "bench unknown model": ["bench", "--target", "no-such-model"],
        "distill target that is a draft": ["distill", "--target", str(REPO_ROOT / "assets/drafts/smollm2-135m-draft"),
                                           "--out", str(tmp_path / "d2")],
        "distill out is a file": ["distill", "--target", tiny, "--out", str(tmp_path / "latin1.txt")],
        "distill on a held-out set under another name": ["distill", "--target", tiny, "--out", str(tmp_path / "d3"),
                                                          "--prompts", str(tmp_path / "mine.jsonl"),
                                                          "--draft-layers", "1"],
        "unknown alias": ["ask", "hi", "--target", "no-such-model"],
        "missing directory": ["ask", "hi", "--target", str(tmp_path / "missing")],
        "negative temperature": ["ask", "hi", "--target", tiny, "--temperature", "-1"],
        "prompt too long": ["ask", "the quick brown fox " * 20, "--target", tiny, "--max-model-len", "16"],
        "bad option value": ["ask", "hi", "--max-tokens", "many"],
        "REPL option before a command": ["--target", tiny, "models"],
        "weights missing offline": ["ask", "hi", "--target", "qwen3-0.6b"],
        "unsupported architecture": ["ask", "hi", "--target", str(broken)],
        "corrupt weights": ["ask", "hi", "--target", str(broken)],
        "missing tokenizer": ["ask", "hi", "--target", str(broken)],
        "core that does not exist": ["ask", "hi", "--target", tiny, "--target-devices", "cpu:4096"],
        "more TP ranks than cores": ["ask", "hi", "--target", tiny, "--tp", "4096"],
        "bad device syntax": ["ask", "hi", "--target", tiny, "--draft", tiny, "--draft-device", "gpu9"],
        "unknown draft weights": ["ask", "hi", "--target", tiny, "--draft", tiny, "--draft-weights", "int4"],
        "unknown cpu matmul": ["ask", "hi", "--target", tiny, "--cpu-matmul", "blas"],
        "prefill chunk of zero": ["ask", "hi", "--target", tiny, "--prefill-chunk", "0"],
        "unknown kv dtype": ["ask", "hi", "--target", tiny, "--kv-dtype", "float8"],
        "unknown enter mode": ["--enter", "sideways"],
        "verbose after a command": ["ask", "hi", "-v"],
        "fanout past the speculation cache": ["ask", "hi", "--target", tiny, "--draft", tiny, "--mode", "ssd",
                                              "--fanout", "99999999999999999999"],  # (2**63 and more: OverflowError)
    }[case]
    result = run_ssd_chat(*args, env={"HF_HUB_CACHE": str(tmp_path / "empty-hub-cache")})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    if case == "weights missing offline":
        assert "hf download Qwen/Qwen3-0.6B" in lines[0]
    if case == "unknown bench mode":
        assert lines[0] == "error: --modes takes ar, sd, ssd, ar-all or sd-all, separated by commas; got 'xx'"
    if case == "unknown enter mode":
        assert lines[0] == "error: --enter (on the command line) takes send or newline; got 'sideways'"
    if case == "fanout past the speculation cache":
        assert lines[0].startswith("error: --fanout takes counts from 0 to 256 (SSD's speculation cache")
    if case == "verbose after a command":
        assert lines[0] == ("error: -v is an option of python -m ssd_chat itself: give it before the command "
                            "(python -m ssd_chat -v ask ...)")
    if case == "distill on a held-out set under another name":
        assert "held-out benchmark set chat.jsonl" in lines[0] and not (tmp_path / "d3").exists()
    if case == "bench sd with no draft":
        assert "draft" in lines[0] and "unknown model" not in lines[0] and "loading" not in result.stderr
    if case.startswith("bench json"):
        assert "loading" not in result.stderr  # refused before the run


def test_ask_with_a_draft_reports_speculation_stats(tiny_llama_dir):
    args = ["ask", "Paris is", "--target", str(tiny_llama_dir), "--draft", str(tiny_llama_dir), "--mode", "ssd",
            "--temperature", "0", "--max-tokens", "10", "--draft-weights", "float32", "--fixed-k", "--json"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["mode"] == "ssd" and stats["spec"]["acceptance_rate"] == 1.0
    assert stats["spec"]["cache_hit_rate"] is not None
    bad = run_ssd_chat("ask", "hi", "--target", str(tiny_llama_dir), "--mode", "sd")  # no draft
    assert bad.returncode == 2 and "draft" in bad.stderr


def test_ask_gives_one_seeded_sampled_reply_in_every_mode(tiny_llama_dir):
    tiny = str(tiny_llama_dir)

    def reply(*extra: str) -> list[int]:
        args = ["ask", "Paris is", "--target", tiny, "--draft", tiny, "--draft-weights", "float32", "--temperature",
                "1.0", "--seed", "11", "--max-tokens", "12", "--json", *extra]
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["token_ids"]

    ar = reply("--mode", "ar")
    assert reply("--mode", "sd") == ar and reply("--mode", "ssd", "--k", "3") == ar  # the coupled race, the default
    assert reply("--mode", "ar", "--sampler", "rejection") != ar  # another sampler: other draws


def test_load_prompts_reads_plain_lines_and_jsonl(tmp_path):
    path = tmp_path / "prompts.txt"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path.write_text(f'plain question\n\n{{"prompt": "json question"}}\n{json.dumps({"messages": messages})}\n')
    assert load_prompts(path) == [
        [{"role": "user", "content": "plain question"}],
        [{"role": "user", "content": "json question"}],
        messages,
    ]
    assert len(load_prompts(path, limit=2)) == 2
    path.write_text('{"prompt": 3}\n')
    with pytest.raises(BenchInputError, match=r"prompts.txt:1"):
        load_prompts(path)


def test_shipped_prompt_set_loads():
    prompts = load_prompts(REPO_ROOT / "assets" / "prompts" / "chat.jsonl")
    assert len(prompts) >= 16
    assert any(len(p) > 1 for p in prompts)


def test_repl_keeps_the_conversation_and_clears_it(tiny_llama_dir):
    turn = "Tell me about the quick brown fox that jumps over the lazy dog, please."
    result = runner.invoke(
        cli.app, ["--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "6"],
        input=f"{turn}\nAnd then?\n/clear\n{turn}\n/exit\n",
    )
    assert result.exit_code == 0, result.output
    stats = [tuple(map(int, m)) for m in re.findall(r"prefix reused (\d+)/(\d+)", result.stderr)]  # stats: stderr
    assert len(stats) == 3, result.stderr
    (_, first), (reused_second, second), (_, after_clear) = stats
    assert second > first + 6           # the history (question + reply) is resent
    assert reused_second > 0            # ... and its prefix comes from the cache
    assert after_clear == first         # /clear starts over
