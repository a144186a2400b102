"""The chat's entries in the command palette (Ctrl+P), beside Textual's own: each one's title, help line and action.

ChatActions.get_system_commands offers them once the engine is loaded, each guarded so that a failure is one
notification, as its slash command's is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ssd_chat.tui.engine_worker import available_modes

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

PaletteCommand = tuple[str, str, Callable[[], object]]  # (title, help line, action)


def palette_commands(app: ChatApp) -> list[PaletteCommand]:
    """The chat's palette entries for `app` with its engine loaded."""
    commands: list[PaletteCommand] = [
        (f"Mode: {mode.upper()}", f"decode with {mode.upper()}", lambda m=mode: app.set_mode(m))
        for mode in available_modes(app.engine)
    ]
    commands += [
        ("Compare modes", "replay the last prompt in AR, SD, SSD (greedy, or one seed)", app.action_compare),
        ("Toggle token colours", "colour reply tokens by provenance", app.action_toggle_colours),
        ("New chat", "start a new conversation", app.action_new_chat),
        ("Chats", "open, rename or delete saved conversations", app.action_chats),
        ("Continue the reply", "write more of the last reply (/continue)", lambda: app.slash_continue("")),
        ("Turns", "show or delete any turn of this chat (/turns)", lambda: app.slash_turns("")),
        ("Export to Markdown", "write this conversation to a .md file", lambda: app.export("")),
        ("Export to plain text", "write this conversation to a .txt file, as typed and written (no Markdown "
         "escapes)", lambda: app.export("", suffix=".txt")),
        ("Keys and commands", "the help screen", app.action_help),
        ("Restart the engine", "close it and load the models again (the conversation stays)",
         lambda: app.slash_restart("")),
    ]
    return commands
