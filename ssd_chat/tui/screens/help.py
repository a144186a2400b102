"""Keys and slash commands in one scrollable box."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from ssd_chat.tui.commands import SLASH_COMMANDS

PROMPT_KEYS = (  # after the send and newline keys, which --enter sets (prompt_input.key_hints)
    ("Tab", "complete a slash command"),
    ("Up / Down", "on the prompt's first / last line: the chat's earlier prompts (typed text is never replaced)"),
    ("PageUp / PageDown", "scroll the conversation"),
    ("Ctrl+P", "command palette (modes, compare, colours, new chat, chats, continue the reply, turns, export, "
               "restart the engine, help, theme)"),
    ("Ctrl+Q", "quit (a reply under way stops and is kept)"),
)


def _cell(text: str) -> str:
    """`text` for a Markdown table cell: its pipes escaped (a bare `|` ends the cell, inside a code span too)."""
    return text.replace("|", "\\|")


def help_markdown(send_keys: Sequence[tuple[str, str]], keys: Sequence[tuple[str, str]]) -> str:
    """`send_keys`: the prompt's send and newline keys; `keys`: the app's bindings (key, action)."""
    lines = ["# ssd-chat help", "", "## Keys", "", "| key | action |", "|---|---|"]
    lines += [f"| {_cell(key)} | {_cell(action)} |" for key, action in (*send_keys, *PROMPT_KEYS, *keys)]
    lines += ["", "## Slash commands", "", "| command | what it does |", "|---|---|"]
    lines += [f"| `{_cell(c.usage)}` | {_cell(c.help)} |" for c in SLASH_COMMANDS]
    lines += ["", "## The figures", "",
              "- **tok/s**: decode speed, the reply's tokens after the first over the time since it.",
              "- **TTFT**: time to the first token (the prompt's reading, less what the prefix cache held).",
              "- **tau** (vLLM's and llama.cpp's mean acceptance length): tokens per target step, the bonus token "
              "included: what one verify pass of the target yields; AR's is 1.",
              "- **accepted** (the acceptance rate): the share of drafted tokens the target accepted; per draft "
              "position in the panel.",
              "- **cache hits** (SSD): the rounds whose draft was ready in the speculation cache, so that drafting "
              "cost the target nothing.",
              "- **prefix reused**: prompt tokens whose KV cache came from an earlier turn."]
    lines += ["", "## Token colours", "",
              "With colours on (Ctrl+T), each reply token shows where it came from: a draft token accepted on a "
              "speculation-cache hit, one accepted after a miss (drafted just in time), a sync-SD draft, or the "
              "target's own recovery / bonus token.", "", "Esc or q closes this screen."]
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,f1", "dismiss", "Close")]

    def __init__(self, send_keys: Sequence[tuple[str, str]], keys: Sequence[tuple[str, str]]) -> None:
        super().__init__(classes="modal", id="help")
        self.send_keys, self.keys = send_keys, keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="modal-box wide"):
            yield Markdown(help_markdown(self.send_keys, self.keys))
