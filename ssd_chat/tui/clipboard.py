"""Copying to the clipboard (/copy): the app writes OSC 52 to the terminal (Textual's copy_to_clipboard), which
reaches the clipboard of the machine the terminal runs on, over ssh too, where the terminal allows it; and on
this machine's own desktop the text also goes to its clipboard tool, since some terminals take no OSC 52 (macOS's
Terminal, tmux without `set-clipboard on`). Over ssh the tool is not used: its clipboard is not the user's."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping

log = logging.getLogger(__name__)
TOOL_TIMEOUT_S = 1.0
# (the command, the environment variable its display needs: None for none)
TOOLS: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("pbcopy",), None),  # macOS
    (("wl-copy",), "WAYLAND_DISPLAY"),
    (("xclip", "-selection", "clipboard"), "DISPLAY"),
    (("xsel", "--clipboard", "--input"), "DISPLAY"),
)


def local_tool(env: Mapping[str, str] = os.environ) -> tuple[str, ...] | None:
    """This desktop's clipboard command, or None (over ssh, no display, or no such tool installed)."""
    if env.get("SSH_CONNECTION") or env.get("SSH_TTY"):
        return None
    for command, display in TOOLS:
        if (display is None or env.get(display)) and shutil.which(command[0], path=env.get("PATH")):
            return command
    return None


def copy_locally(text: str, env: Mapping[str, str] = os.environ) -> str | None:
    """Give `text` to this desktop's clipboard tool; its name if it took it, else None (a failure is logged only:
    the terminal's copy may have worked)."""
    command = local_tool(env)
    if command is None:
        return None
    try:
        subprocess.run(command, input=text.encode("utf-8"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=TOOL_TIMEOUT_S, check=True, env=dict(env))
    except (OSError, subprocess.SubprocessError) as err:
        log.info("the clipboard tool %s failed: %s", command[0], err)
        return None
    return command[0]
