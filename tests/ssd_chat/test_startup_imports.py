"""Start-up: the chat app's process imports neither torch nor transformers (its engine runs in a process of its
own), and it starts that process before it imports Textual, so that the engine loads while the app starts. Each
check runs in a fresh interpreter: this one has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from ssd_chat.prompts import DEFAULT_PROMPTS

HEAVY = ("torch", "transformers", "textual")


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cli_and_the_chat_app_import_no_torch():
    loaded = _run(f"""
        import json, sys
        import ssd_chat.cli, ssd_chat.tui, ssd_chat.tui.app, ssd_chat.tui.engine_process
        print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))
    """)
    assert loaded == {"torch": False, "transformers": False, "textual": True}


def test_the_engine_process_starts_before_the_app_imports_textual():
    seen = _run(f"""
        import json, sys
        from ssd_chat import cli
        from ssd_chat.tui import engine_process

        seen = {{}}

        class Started:
            @classmethod
            def start(cls, target, **kwargs):
                seen.update({{m: m in sys.modules for m in {HEAVY!r}}}, target=target)
                raise SystemExit(0)

        engine_process.EngineProcess = Started
        cli._in_a_terminal = lambda: True
        sys.argv = ["ssd-chat"]
        try:
            cli.main()
        except SystemExit:
            pass
        print(json.dumps(seen))
    """)
    assert seen == {"torch": False, "transformers": False, "textual": False, "target": "smollm2-135m"}


def test_a_ctrl_q_before_the_app_has_the_terminal_waits_for_it(monkeypatch):
    """keys_reach_the_app: the terminal's flow control (IXON, which takes Ctrl+Q as XON) is off until the app runs,
    so an early Ctrl+Q reaches it; the settings are restored after, and a stdin that is no terminal is left be."""
    import io
    import os
    import termios

    from ssd_chat.tui import keys_reach_the_app

    leader, follower = os.openpty()
    try:
        attrs = termios.tcgetattr(follower)
        attrs[0] |= termios.IXON
        termios.tcsetattr(follower, termios.TCSANOW, attrs)
        monkeypatch.setattr(sys, "stdin", os.fdopen(follower, "r", closefd=False))
        with keys_reach_the_app():
            assert not termios.tcgetattr(follower)[0] & termios.IXON
            os.write(leader, b"\x11\n")  # Ctrl+Q stays in the input (a terminal's XON would take it: b"\n")
            assert os.read(follower, 16) == b"\x11\n"
        assert termios.tcgetattr(follower) == attrs
    finally:
        os.close(leader)
        os.close(follower)
    monkeypatch.setattr(sys, "stdin", io.StringIO("piped"))
    with keys_reach_the_app():
        pass


def test_the_app_reads_the_engines_token_texts_without_transformers(tiny_llama_dir, tmp_path):
    """The engine's "ready" carried transformers' tokenizer, and unpickling it imported transformers in the app:
    1.1 s before the app said it was ready. Its TokenDecoder carries the `tokenizers` library's alone, and decodes
    each token as transformers' tokenizer does."""
    import pickle

    from engine.registry import resolve_model
    from engine.startup import load_tokenizer
    from ssd_chat.tui.engine_server import TokenDecoder

    for path in (tiny_llama_dir, resolve_model("smollm2-135m")):
        tokenizer = load_tokenizer(path)
        blob = pickle.dumps(TokenDecoder(tokenizer))
        decoder = pickle.loads(blob)
        ids = range(0, len(tokenizer), max(1, len(tokenizer) // 3000))  # (specials first, then every 16th id)
        assert [decoder.decode([i]) for i in ids] == [tokenizer.decode([i]) for i in ids]
    (tmp_path / "decoder.pickle").write_bytes(blob)
    loaded = _run(f"""
        import json, pickle, sys
        pickle.loads(open({str(tmp_path / "decoder.pickle")!r}, "rb").read()).decode([1, 2, 3])
        print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))
    """)
    assert loaded == {"torch": False, "transformers": False, "textual": False}


def test_a_wrong_model_or_setting_is_refused_before_torch_loads(tiny_llama_dir, tmp_path):
    """`ask`, the plain mode, `bench` and `distill` said a mistyped name in 3-4 s on the 2-vCPU VM, after torch (and
    for bench transformers) had loaded; they now say it first (check_before_loading; distill: checked_target and
    check_out; its prompt file's held-out prompts and size: checked_prompts): the same one line, in under a second."""
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "mine.jsonl").write_bytes(DEFAULT_PROMPTS.read_bytes())  # (a held-out set under another name)
    tiny = str(tiny_llama_dir)
    cases = {
        "unknown model 'no-such-model'": ["ask", "hi", "--target", "no-such-model"],
        "no such directory": ["ask", "hi", "--target", str(tmp_path / "missing")],
        "has no config.json": ["ask", "hi", "--target", tiny, "--draft", str(tmp_path / "empty")],
        "core 4096 does not exist": ["ask", "hi", "--target", tiny, "--target-devices", "cpu:4096"],
        "needs a draft model": ["--plain", "--target", tiny, "--mode", "sd", "--draft", "none"],
        "unknown model 'typo'": ["bench", "--target", "typo"],
        "not UTF-8": ["bench", "--target", tiny, "--prompts", str(tmp_path / "latin1.txt")],
        "is a distilled draft": ["distill", "--target", "smollm2-135m-draft", "--out", str(tmp_path / "d")],
        "is a file": ["distill", "--target", tiny, "--out", str(tmp_path / "latin1.txt")],
        "of the held-out benchmark set chat.jsonl": ["distill", "--target", tiny, "--out", str(tmp_path / "h"),
                                                     "--prompts", str(tmp_path / "mine.jsonl"), "--draft-layers", "1"],
        "fewer than one batch": ["distill", "--target", tiny, "--out", str(tmp_path / "b"), "--max-prompts", "4",
                                 "--eval-prompts", "3", "--batch-size", "2", "--draft-layers", "1"],
    }
    for said, args in cases.items():
        seen = _run(f"""
            import contextlib, io, json, sys
            from ssd_chat import cli

            sys.argv = ["ssd-chat", *{args!r}]
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    cli.main()
                except SystemExit as exit:
                    code = exit.code
            print(json.dumps({{"code": code, "stderr": err.getvalue(), "torch": "torch" in sys.modules}}))
        """)
        assert seen["code"] == 2 and seen["stderr"].count("\n") == 1 and said in seen["stderr"], (args, seen)
        assert not seen["torch"], args
