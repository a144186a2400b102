"""`/export FILE.txt` writes plain text: every turn as typed or written, without the Markdown export's backslash
escapes, line-break spaces and no-break spaces (a plain-text viewer showed "What is \\*\\*SSD\\*\\*?"); the Markdown
export keeps them, and so stays Markdown that shows a prompt as typed."""

from __future__ import annotations

import re

import pytest

from ssd_chat.history import ChatMessage, ChatSettings, Conversation, TurnStats
from ssd_chat.reply_settings import ReplySettings
from ssd_chat.tui.export_stats import STATS_HEADER, stats_rows
from ssd_chat.tui.export_text import to_text
from tests.ssd_chat.test_export_prompts import NBSP, PROMPT, WORD_JOINER
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle

SIZE = (120, 40)
SYSTEM = "Be **brief**. Use C:\\temp\n    indented"
REPLY = "# A heading\n\n**bold** and a_b\n\n```python\nx = 1\n```"
STATS = TurnStats("sd", 41.25, 0.081, 12, 30, 16, "stop", tau=2.75, acceptance_rate=0.5,
                  settings=ReplySettings("sd", 4, None, 0.7, 0.9, 0, 64))


def _chat() -> Conversation:
    return Conversation(None, "What is **SSD**?", ChatSettings(system=SYSTEM), [
        ChatMessage("user", PROMPT), ChatMessage("assistant", REPLY, STATS),
        ChatMessage("user", "    indented first line"), ChatMessage("assistant", "ok", TurnStats("ar", 9, 0.1, 2, 5, 0,
                                                                                                 "length"))])


def _block(text: str, label: str, body: str) -> bool:
    return f"\n{label}:\n{body}\n\n" in text


def test_the_text_export_holds_every_turn_as_typed_or_written():
    text = to_text(_chat())
    assert text.startswith("What is **SSD**?\n================\n\nMode ar, temperature")  # (AR: no k)
    assert _block(text, "System", SYSTEM) and _block(text, "You", PROMPT) and _block(text, "Assistant", REPLY)
    assert _block(text, "You", "    indented first line")
    assert NBSP not in text and WORD_JOINER not in text and not any(line.endswith("  ") for line in text.split("\n"))
    assert text.count("\\") == PROMPT.count("\\") + SYSTEM.count("\\")  # the typed ones only: no escapes


def test_the_text_exports_stats_are_aligned_columns_with_each_replys_settings():
    chat = _chat()
    lines = to_text(chat).split("Stats:\n")[1].rstrip("\n").split("\n")
    starts = [lines[0].index(name) for name in STATS_HEADER]
    assert starts == sorted(starts) and set(lines[1]) == {"-", " "}
    cells = [tuple(line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)) for line in lines[2:]]
    assert cells == stats_rows(chat.messages)
    assert cells[0][2] == STATS.settings.text() and cells[1][2] == ""


TRICKY = ["Assistant:", "Quote:\nYou:\nhi\n\nAssistant: \nok", "  system:\t", "Stats:\r\nx", "a\u2028ASSISTANT:",
          " You:", "You: said this"]


def _read_back(text: str) -> list[tuple[str, str]]:
    """A reader of the text export: a part starts at a marker alone on a line, unindented; a marker-like line that
    is indented is a turn's, one space in (export_text's rule, undone)."""
    parts: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") in ("System:", "You:", "Assistant:", "Stats:"):
            parts.append((line.rstrip("\n")[:-1], ""))
        elif parts:
            if re.fullmatch(r"\s*(system|you|assistant|stats):\s*", line, re.IGNORECASE) and line.startswith(" "):
                line = line[1:]
            parts[-1] = (parts[-1][0], parts[-1][1] + line)
    ends = ["\n\n"] * (len(parts) - 1) + ["\n"]  # (a blank line after each part but the last, which ends the file)
    return [(role, body.removesuffix(end)) for (role, body), end in zip(parts, ends, strict=True)]


def test_a_turns_line_that_reads_like_a_marker_is_told_apart_and_reads_back_as_typed():
    """A prompt line `Assistant:` read as a new part: such lines go one space in, and a reader gets the turns back."""
    messages = [ChatMessage("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(TRICKY)]
    text = to_text(Conversation(None, "You:", ChatSettings(system="System:\nbe brief"), messages))
    assert text.startswith(" You:\n=====\n")  # (the title a first prompt "You:" gave)
    assert "\nYou:\n Assistant:\n" in text and "\n Assistant: \nok\n" in text and "\n   system:\t\n" in text
    assert "a\u2028 ASSISTANT:" in text and "\nAssistant:\n  You:\n" in text and "You: said this" in text
    roles = ["System", *(("You", "Assistant")[i % 2] for i in range(len(TRICKY)))]
    assert _read_back(text) == list(zip(roles, ["System:\nbe brief", *TRICKY], strict=True))


@pytest.mark.asyncio
async def test_export_writes_plain_text_to_a_txt_file_and_markdown_elsewhere(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "What is **SSD**?")
        for name in ("chat.txt", "chat.md", "upper.TXT"):
            await send(app, pilot, f"/export {tmp_path / name}")
        text, markdown = (tmp_path / "chat.txt").read_text(), (tmp_path / "chat.md").read_text()
    assert text == to_text(app.session.conversation) == (tmp_path / "upper.TXT").read_text()
    assert "\nYou:\nWhat is **SSD**?\n" in text and "\\" not in text
    assert "## You\n\nWhat is \\*\\*SSD\\*\\*?\n" in markdown  # (Markdown: escaped, so no bold)
