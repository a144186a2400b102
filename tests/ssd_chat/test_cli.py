"""The `ssd-chat` CLI on a tiny random model: output matches the engine, user errors are one line + exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine import LLM, SamplingParams
from engine.outputs import RequestFinished, TokenDelta
from engine.registry import ALIASES
from ssd_chat import cli, stop_signals
from ssd_chat.prompts import BenchInputError, load_prompts

REPO_ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
BUFFERED_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout as a user's: buffered


def _greedy_chat(model_dir: Path, prompt: str, max_tokens: int):
    llm = LLM(target=str(model_dir))
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        events = list(llm.chat([{"role": "user", "content": prompt}], params))
    finally:
        llm.close()
    assert isinstance(events[-1], RequestFinished)
    return events[-1].output


def _ssd_chat(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real entry point in a fresh process: the exit code and stderr the user sees."""
    return subprocess.run(
        [sys.executable, "-m", "ssd_chat", *args], cwd=REPO_ROOT, input=stdin, capture_output=True, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, timeout=120,
    )


def test_a_draft_process_start_prints_nothing_but_the_reply(tiny_llama_dir):
    """torch's C++ rendezvous warnings (c10d socket timeouts while the draft process starts) stay hidden."""
    tiny = str(tiny_llama_dir)
    result = _ssd_chat("ask", "Paris is", "--target", tiny, "--draft", tiny, "--mode", "ssd", "--draft-device", "cpu",
                       "--temperature", "0", "--max-tokens", "4")
    assert result.returncode == 0, result.stderr
    assert "c10d" not in result.stderr and "socket" not in result.stderr, result.stderr


def test_models_lists_every_alias():
    result = runner.invoke(cli.app, ["models"])
    assert result.exit_code == 0, result.output
    for alias, spec in ALIASES.items():
        assert alias in result.stdout
        assert spec.family in result.stdout


def test_ask_streams_the_greedy_reply(tiny_llama_dir):
    expected = _greedy_chat(tiny_llama_dir, "Paris is", 8)
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
    expected = _greedy_chat(tiny_llama_dir, "Paris is a city of lights and of long walks by the river", 6)
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


def test_ask_reads_the_prompt_from_stdin(tiny_llama_dir):
    expected = _greedy_chat(tiny_llama_dir, "Paris is", 5)
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
     "distill target that is a draft", "distill out is a file", "prefill chunk of zero",
     "distill on a held-out set under another name", "unknown enter mode", "verbose after a command"],
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
        "unknown enter mode": ["--enter", "sideways"],
        "verbose after a command": ["ask", "hi", "-v"],
    }[case]
    result = _ssd_chat(*args, env={"HF_HUB_CACHE": str(tmp_path / "empty-hub-cache")})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    if case == "weights missing offline":
        assert "hf download Qwen/Qwen3-0.6B" in lines[0]
    if case == "unknown bench mode":
        assert "unknown mode(s) xx" in lines[0]
    if case == "unknown enter mode":
        assert lines[0] == "error: --enter (on the command line) takes send or newline, got 'sideways'"
    if case == "verbose after a command":
        assert lines[0].endswith("give it before the command (ssd-chat -v ask ...)")
    if case == "distill on a held-out set under another name":
        assert "held-out benchmark set chat.jsonl" in lines[0] and not (tmp_path / "d3").exists()
    if case == "bench sd with no draft":
        assert "draft" in lines[0] and "unknown model" not in lines[0] and "loading" not in result.stderr
    if case.startswith("bench json"):
        assert "loading" not in result.stderr  # refused before the run


def test_bench_writes_results_and_matches_transformers(tiny_llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(tiny_llama_dir), "--modes", "ar", "--hf", "--max-tokens", "8", "--limit", "2",
            "--json", str(out)]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report["machine"]) == {"cpu", "cores", "threads", "torch", "transformers", "python"}
    assert report["config"]["num_prompts"] == 2
    assert report["config"]["max_tokens"] == 8
    assert Path(report["config"]["model_path"]) == Path(tiny_llama_dir).resolve()
    ar, hf = report["results"]
    assert (ar["mode"], hf["mode"]) == ("ar", "hf")
    for row in (ar, hf):
        assert row["decode_tok_s"] > 0 and row["ttft_ms"] > 0
        assert [len(ids) for ids in row["outputs"]] == [8, 8]
    assert ar["identical_to_ar"] is None
    assert hf["identical_to_ar"] is True
    assert hf["outputs"] == ar["outputs"]
    assert "hf" in result.stdout


def test_bench_no_ignore_eos_stops_each_reply_at_its_end_of_turn(tiny_llama_dir, tmp_path):
    def bench(model: Path, out: Path, *extra: str) -> list[dict]:
        args = ["bench", "--target", str(model), "--max-tokens", "12", "--limit", "2", "--json", str(out), *extra]
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())["results"]

    fixed = bench(tiny_llama_dir, tmp_path / "fixed.json", "--modes", "ar")[0]["outputs"]
    end = fixed[0][3]  # a token the first greedy reply emits early: made the end of turn below
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    for name in ("config.json", "generation_config.json"):  # the engine reads both; transformers the second
        config = json.loads((model / name).read_text())
        config["eos_token_id"] = [end, config["eos_token_id"]]
        (model / name).write_text(json.dumps(config))
    rows = bench(model, tmp_path / "stopped.json", "--modes", "ar,sd", "--draft", str(model), "--hf",
                 "--no-ignore-eos")
    assert [r["mode"] for r in rows] == ["ar", "sd", "hf", "hf-assisted"]
    assert rows[0]["outputs"][0] == fixed[0][: fixed[0].index(end) + 1]
    assert all(r["outputs"] == rows[0]["outputs"] for r in rows)  # transformers stops at the same token
    assert bench(model, tmp_path / "ignored.json", "--modes", "ar")[0]["outputs"] == fixed


def test_bench_speculative_modes_report_tau_and_hits(tiny_llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    draft = str(tiny_llama_dir)  # the target as its own draft: everything is accepted, the cache always hits
    args = ["bench", "--target", str(tiny_llama_dir), "--draft", draft, "--modes", "ar,sd,ssd", "--hf", "--k", "3",
            "--fixed-k", "--no-lookup", "--draft-weights", "float32", "--max-tokens", "12", "--limit", "2",
            "--cpu-matmul", "panel", "--json", str(out)]  # adaptive: k=1, so costly a draft; lookup off: the draft
    # alone is measured; the panel kernel (where it builds) in every mode: SD and SSD still equal AR and transformers
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["adaptive_k"] is False and report["config"]["lookup"] is False
    assert report["config"]["packed_kernel"] == "panel"
    config = report["config"]  # the bound: the weights read once per token at the faster of two read rates
    fastest = max(config["matvec_gb_s"], config["sum_gb_s"])
    rounding = 0.05 * 1e9 / config["weight_bytes"]  # the stored rates are rounded to 0.1 GB/s (a loaded CPU: 3 GB/s)
    assert config["bandwidth_bound_tok_s"] == pytest.approx(fastest * 1e9 / config["weight_bytes"], abs=rounding + 0.1)
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["ar", "sd", "ssd", "hf", "hf-assisted"]
    assert all(rows[m]["identical_to_ar"] for m in ("sd", "ssd", "hf", "hf-assisted"))
    assert rows["ar"]["tau"] is None and rows["ar"]["cache_hit_rate"] is None
    assert rows["sd"]["acceptance_rate"] == 1.0 and rows["sd"]["tau"] > 3.0
    assert rows["sd"]["cache_hit_rate"] is None
    assert rows["ssd"]["cache_hit_rate"] > 0.5 and rows["ssd"]["ideal_tok_s"] > 0
    assert rows["ar"]["round_ms"] is None and set(rows["sd"]["round_ms"]) == {"verify", "wait"}
    ms, hit_rate = rows["ssd"]["round_ms"], rows["ssd"]["cache_hit_rate"]  # the split adds up to the mean wait
    assert ms["verify"] > 0 and hit_rate * ms["wait_on_hit"] + (1 - hit_rate) * ms["wait_on_miss"] == \
        pytest.approx(ms["wait"])
    assert "\nsd per round: verify " in result.output and "\nssd per round: verify " in result.output
    assert "(cache hit " in result.output


def test_bench_places_the_draft_in_its_own_process_and_measures_every_core(tiny_llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    tiny = str(tiny_llama_dir)
    args = ["bench", "--target", tiny, "--draft", tiny, "--modes", "ar,ssd,ar-all,sd-all", "--k", "3",
            "--max-tokens", "12", "--limit", "2", "--target-devices", "cpu:0", "--draft-device", "cpu",
            "--threads", "1", "--json", str(out)]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["ar", "ssd", "ar-all", "sd-all"]
    assert all(rows[m]["identical_to_ar"] for m in ("ssd", "ar-all", "sd-all"))
    assert rows["ssd"]["cache_hit_rate"] > 0.5
    assert rows["ar-all"]["tau"] is None and rows["sd-all"]["tau"] > 1.0  # the every-core SD row speculates
    assert rows["ar-all"]["row_cost"] is None and rows["sd-all"]["row_cost"] is not None  # fitted in SD rounds
    assert "own process" in report["config"]["layout"]["draft"]


def test_bench_every_core_row_keeps_the_fast_path_options(tiny_llama_dir, tmp_path, monkeypatch):
    from ssd_chat import bench

    seen = []

    def recording_llm(**kwargs):
        seen.append(kwargs)
        return LLM(**{**kwargs, "compile": False})  # the options arrive; no compile in this test

    monkeypatch.setattr(bench, "LLM", recording_llm)
    args = ["bench", "--target", str(tiny_llama_dir), "--modes", "ar,ar-all,ar", "--max-tokens", "4", "--limit", "1",
            "--compile", "--dtype", "float32", "--json", str(tmp_path / "b.json")]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert len(seen) == 2 and all(k["compile"] and k["dtype"] == "float32" for k in seen)  # (ar named twice: once)
    assert [r["mode"] for r in json.loads((tmp_path / "b.json").read_text())["results"]] == ["ar", "ar-all"]


def test_ask_with_a_draft_reports_speculation_stats(tiny_llama_dir):
    args = ["ask", "Paris is", "--target", str(tiny_llama_dir), "--draft", str(tiny_llama_dir), "--mode", "ssd",
            "--temperature", "0", "--max-tokens", "10", "--draft-weights", "float32", "--json"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["mode"] == "ssd" and stats["spec"]["acceptance_rate"] == 1.0
    assert stats["spec"]["cache_hit_rate"] is not None
    bad = _ssd_chat("ask", "hi", "--target", str(tiny_llama_dir), "--mode", "sd")  # no draft
    assert bad.returncode == 2 and "draft" in bad.stderr


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


@pytest.mark.parametrize("args", [["ask", "-"], ["--plain"], []], ids=["ask -", "plain", "piped chat"])
def test_a_closed_stdin_is_a_one_line_error(args, tiny_llama_dir):
    """`ssd-chat ask - <&-`: Python's sys.stdin is None, and the prompt (or the plain mode's lines) cannot come."""
    result = subprocess.run(
        [sys.executable, "-m", "ssd_chat", *args, "--target", str(tiny_llama_dir)], cwd=REPO_ROOT,
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stdin is closed"), result.stderr


@pytest.mark.parametrize("args", [["ask", "Paris is"], ["--plain"], ["models"], ["bench", "--limit", "1"]],
                         ids=["ask", "plain", "models", "bench"])
def test_a_closed_stdout_is_a_one_line_error(args, tiny_llama_dir):
    """`ssd-chat ... >&-`: Python's sys.stdout is None; input() and rich raised, and ask's reply was dropped."""
    result = subprocess.run(
        [sys.executable, "-m", "ssd_chat", *args, *([] if args == ["models"] else ["--target", str(tiny_llama_dir)])],
        cwd=REPO_ROOT, input="Paris is\n", capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120, preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stdout is closed"), result.stderr


@pytest.mark.parametrize("args", [["ask", "Paris is"], ["ask", "Paris is", "--json"], ["--plain"]],
                         ids=["ask", "ask --json", "plain"])
def test_a_reader_gone_ends_it_quietly_as_sigpipe_would(args, tiny_llama_dir):
    """`ssd-chat ask ... | head -c 10`: the write after stdout's reader went away (here before the first write:
    the same BrokenPipeError) ends it with 128 + SIGPIPE, and no traceback (the same mid-reply in SSD:
    test_stop_signals)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ssd_chat", *args, "--target", str(tiny_llama_dir), "--max-tokens", "8"],
            cwd=REPO_ROOT, input="Paris is\n", stdout=write, stderr=subprocess.PIPE, text=True,
            env={**BUFFERED_ENV, "HF_HUB_OFFLINE": "1"}, timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 128 + signal.SIGPIPE, proc.stderr
    assert proc.stderr == ""


def test_the_plain_modes_rich_writes_to_a_gone_reader_end_with_141(tiny_llama_dir):
    """With stdin a terminal the plain mode's first write is its banner, through rich, whose own broken-pipe
    handling exited with 1 (so did its stats line). With stdout no terminal the banner goes to stderr: here both
    go to the gone reader, as with `2>&1 | head`."""
    import pty

    master, slave = pty.openpty()
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ssd_chat", "--plain", "--target", str(tiny_llama_dir), "--max-tokens", "8"],
            cwd=REPO_ROOT, stdin=slave, stdout=write, stderr=write, text=True,
            env={**BUFFERED_ENV, "HF_HUB_OFFLINE": "1"}, timeout=120,
        )
    finally:
        for fd in (write, slave, master):
            os.close(fd)
    assert proc.returncode == 128 + signal.SIGPIPE  # (a traceback, or rich's own handling, exits with 1)


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


class _CtrlCAfterTwoDeltas:
    """The real engine, with Ctrl-C (SIGINT) pressed after the first reply's second token delta."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.config = llm.config
        self.max_model_len, self.encode_chat = llm.max_model_len, llm.encode_chat
        self.calls: list[list[dict[str, str]]] = []

    def chat(self, messages, params, *, cancel=None):
        self.calls.append([dict(m) for m in messages])
        num_deltas = 0
        for event in self.llm.chat(messages, params, cancel=cancel):
            yield event
            num_deltas += isinstance(event, TokenDelta)
            if len(self.calls) == 1 and num_deltas == 2:
                os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_cancels_the_reply_and_keeps_the_partial_text(tiny_llama_dir, monkeypatch, capsys):
    llm = LLM(target=str(tiny_llama_dir))
    proxy = _CtrlCAfterTwoDeltas(llm)
    lines = iter(["hi", "again"])

    def fake_input(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under a background `cmd &`
    try:
        cli.run_repl(proxy, SamplingParams(temperature=0, max_tokens=8), system=None)
    finally:
        llm.close()
    out = capsys.readouterr().err  # the stats lines
    assert re.search(r"· 2 tokens · .* stopped: cancelled", out), out
    assert re.search(r"· 8 tokens · ", out), out  # the next turn runs to completion
    partial = _greedy_chat(tiny_llama_dir, "hi", 2).text
    assert proxy.calls[1] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": partial},
        {"role": "user", "content": "again"},
    ]
    assert signal.getsignal(signal.SIGINT) is before  # the chat's own Ctrl-C handler is gone again


@pytest.fixture
def own_signals():
    """main() installs its own Ctrl-C, SIGTERM and SIGHUP handlers (and ignores them once it is done): the test's
    process gets its own back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *stop_signals.STOP_SIGNALS)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_ctrl_c_while_the_modules_import_exits_130_without_a_traceback(monkeypatch, capsys, own_signals):
    from ssd_chat import entry

    def interrupted(name: str):
        raise KeyboardInterrupt

    monkeypatch.setattr(entry.importlib, "import_module", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        entry.main()
    assert exit_info.value.code == 130
    assert "Traceback" not in capsys.readouterr().err


def test_a_reply_stopped_mid_line_ends_its_line(monkeypatch, capsys, own_signals):
    """A second Ctrl-C (or SIGTERM) mid-reply in `ask`, through the real CLI: the partial reply's line is ended, so
    the shell's prompt does not start on it; exit 130, no traceback. (typer turns the interrupt into exit 130
    itself, so the line has to end where the reply is written.)"""
    from engine.outputs import TokenDelta
    from ssd_chat import cli

    class Interrupted:
        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def chat(self, messages, params):
            yield TokenDelta(0, (5,), "a partial rep")
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "LLM", lambda **kwargs: Interrupted())
    monkeypatch.setattr(sys, "argv", ["ssd-chat", "ask", "hi"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 130 and captured.out == "a partial rep\n" and "Traceback" not in captured.err
