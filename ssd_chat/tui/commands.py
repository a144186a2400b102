"""Slash commands: the table the help screen and completion read, and parsing of a typed line."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SlashSpec:
    name: str
    usage: str
    help: str

    @property
    def takes_argument(self) -> bool:
        """Whether its usage names one (`/k N`, `/chats [TEXT]`): one that does not refuses any (`/clear now`)."""
        return " " in self.usage


SLASH_COMMANDS: tuple[SlashSpec, ...] = (
    SlashSpec("mode", "/mode ar|sd|ssd", "switch the decoding mode (sd and ssd need a draft model)"),
    SlashSpec("k", "/k N", "most draft tokens per verify step (1-32; the CPU drafts at most 31)"),
    SlashSpec("fanout", "/fanout N | N,N,...", "SSD candidates per accepted count (0-256: one, or k+1); none: default"),
    SlashSpec("temp", "/temp T", "sampling temperature (0 = greedy)"),
    SlashSpec("top-p", "/top-p P", "sample from the likeliest tokens that hold P of the mass (1 = off)"),
    SlashSpec("top-k", "/top-k N", "sample from the N likeliest tokens (0 = off)"),
    SlashSpec("seed", "/seed N|last|off", "sample from seed N (last: the last reply's): one reply in every mode"),
    SlashSpec("max-tokens", "/max-tokens N", "the most tokens a reply generates (the run's --max-tokens)"),
    SlashSpec("system", "/system TEXT", "set the system prompt (no text: remove it)"),
    SlashSpec("enter", "/enter send|newline", "what Enter does: send, or a new line (then Ctrl+S sends)"),
    SlashSpec("clear", "/clear", "clear this conversation's turns"),
    SlashSpec("new", "/new", "start a new conversation (the current one stays in history)"),
    SlashSpec("chats", "/chats [TEXT]", "open, search, rename or delete saved conversations (TEXT: search for it)"),
    SlashSpec("rename", "/rename TITLE", "rename this conversation"),
    SlashSpec("regen", "/regen", "regenerate the last reply"),
    SlashSpec("continue", "/continue", "write more of the last reply (one the length limit cut, say)"),
    SlashSpec("edit", "/edit", "put the last prompt back in the input to edit and resend"),
    SlashSpec("undo", "/undo", "remove the last prompt and its reply from the conversation"),
    SlashSpec("turns", "/turns",
              "the chat's turns: Enter shows one, d twice deletes one (any turn, not only the last)"),
    SlashSpec("compare", "/compare", "replay the last prompt in AR, SD and SSD (greedy, or one seed) and compare"),
    SlashSpec("colors", "/colors", "toggle token provenance colours"),
    SlashSpec("copy", "/copy [code]", "copy the last reply (code: its code blocks) to the clipboard"),
    SlashSpec("export", "/export[!] [FILE]",
              "write this chat as Markdown with a stats table (FILE.txt: plain text; ! replaces FILE)"),
    SlashSpec("restart", "/restart", "stop the engine and load the models again (the conversation stays)"),
    SlashSpec("help", "/help", "keys and commands"),
)
_BY_NAME = {c.name: c for c in SLASH_COMMANDS}
ENTER_MODES = ("send", "newline")  # what Enter does in the prompt: --enter, /enter
_FORCEABLE = frozenset({"export"})  # "/name!": do it even where it replaces something (vim's :w!)


@dataclass(frozen=True)
class SlashCommand:
    name: str
    arg: str  # the rest of the line, stripped ("" when none)
    force: bool = False  # typed as /name!


class SlashError(ValueError):
    """A line that starts with / but names no command; the message is one line for a notification."""


def prompt_text(typed: str) -> str:
    """What a typed prompt sends: without the blank lines before it and the whitespace after it, its first line's
    indent kept (a pasted block of code lost it, and so its lines' relative indents); `//` sends one `/`."""
    text = re.sub(r"^(?:[ \t]*\r?\n)+", "", typed.rstrip())
    return text.replace("/", "", 1) if text.lstrip().startswith("//") else text


def as_typed(prompt: str) -> str:
    """A sent prompt as it would be typed again: one that starts with / (after its indent) gets back the / of the
    // that sent it (prompt_text takes it off)."""
    return prompt.replace("/", "//", 1) if prompt.lstrip().startswith("/") else prompt


def is_slash(text: str) -> bool:
    return text.startswith("/") and not text.startswith("//")


def split_slash(text: str) -> tuple[str, str]:
    """A slash line's command name (lower case; it ends at any whitespace, a newline too) and the rest."""
    parts = text.strip()[1:].split(maxsplit=1)
    return (parts[0].lower() if parts else ""), (parts[1] if len(parts) > 1 else "")


def parse_slash(text: str) -> SlashCommand:
    name, rest = split_slash(text)
    force = name.endswith("!") and name[:-1] in _BY_NAME
    if force:
        name = name[:-1]
        if name not in _FORCEABLE:
            raise SlashError(f"/{name} takes no ! (only /export! does)")
    if name not in _BY_NAME:
        matches = completions("/" + name)
        hint = f" (did you mean {matches[0].usage}?)" if len(matches) == 1 else " (/help lists them)"
        raise SlashError(f"unknown command /{name}{hint}")
    if rest.strip() and not _BY_NAME[name].takes_argument:  # ("/clear now" cleared the chat, which has no undo)
        raise SlashError(f"/{name} takes no argument: send /{name} alone")
    return SlashCommand(name, rest.strip(), force)


def completions(text: str) -> list[SlashSpec]:
    """Commands whose name starts with what follows the slash (nothing once a space is typed)."""
    if not is_slash(text) or " " in text:
        return []
    prefix = text[1:].lower()
    return [c for c in SLASH_COMMANDS if c.name.startswith(prefix)]


def complete(text: str) -> str | None:
    """Tab completion: the full command when the prefix picks one (or the list's common prefix grows)."""
    matches = completions(text)
    if not matches:
        return None
    if len(matches) == 1:
        return f"/{matches[0].name} "
    common = matches[0].name
    for m in matches[1:]:
        while not m.name.startswith(common):
            common = common[:-1]
    return f"/{common}" if len(common) > len(text) - 1 else None


