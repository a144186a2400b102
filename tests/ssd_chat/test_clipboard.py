"""The desktop clipboard tool beside the terminal's OSC 52 (/copy): which tool, when not, and what it gets."""

from __future__ import annotations

import shutil
import stat

from ssd_chat.tui import clipboard


def _tool(folder, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_desktop_tool_gets_the_text_and_not_over_ssh_or_without_a_display(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "xclip", f'{shutil.which("cat")} > "{tmp_path / "got"}"')
    env = {"PATH": str(bin_dir), "DISPLAY": ":0"}
    assert clipboard.local_tool(env) == ("xclip", "-selection", "clipboard")
    assert clipboard.copy_locally("héllo\nworld", env) == "xclip"
    assert (tmp_path / "got").read_text(encoding="utf-8") == "héllo\nworld"
    assert clipboard.local_tool({"PATH": str(bin_dir)}) is None  # no display: no X clipboard
    assert clipboard.local_tool({**env, "SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22"}) is None  # not the user's
    _tool(bin_dir, "pbcopy", "exit 0")
    assert clipboard.local_tool({"PATH": str(bin_dir)}) == ("pbcopy",)  # (macOS: no display variable)


def test_a_failing_tool_is_no_error(tmp_path):
    _tool(tmp_path, "pbcopy", "exit 3")
    assert clipboard.copy_locally("x", {"PATH": str(tmp_path)}) is None
    _tool(tmp_path, "pbcopy", f"{shutil.which('sleep')} 5")
    assert clipboard.copy_locally("x", {"PATH": str(tmp_path)}) is None  # past TOOL_TIMEOUT_S
