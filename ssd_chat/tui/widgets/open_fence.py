"""A code block still streaming, drawn a run of lines at a time: each whole run of `RUN` lines once, the rest anew.

A reply's last block is drawn again at every update (reply_markdown.py), and Rich draws a code block whole: on a
2-vCPU Zen 1 VM 38 ms for 50 lines, about 0.7 ms a line, so a 400-line program cost a third of a second an update
of the UI thread. While the fence is open its code only grows, so the runs before the last keep their lines. Each
run is highlighted on its own, so a string or comment that spans a run's edge may be coloured as code until the
reply ends: the finished reply (`ReplyMarkdown.update`) draws the block whole, as Rich does.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions
from rich.syntax import Syntax
from textual.strip import Strip

from ssd_chat.tui.widgets.markdown_parser import block_parser, common_prefix

RUN = 32  # lines a kept run holds


def open_fence_code(block: str) -> tuple[str, str] | None:
    """(the lexer's name, the code) where `block` is a fenced code block at the margin with no closing fence yet;
    else None."""
    if not block.startswith(("```", "~~~")):  # (not parsed: a long list would be, whole, at every update)
        return None
    tokens = block_parser().parse(block)
    if len(tokens) != 1 or tokens[0].type != "fence" or not block.startswith(tokens[0].markup):
        return None
    code = block.partition("\n")[2]
    if code.rstrip() != tokens[0].content.rstrip():  # (closed: the content leaves the closing fence out)
        return None
    return tokens[0].info.partition(" ")[0] or "text", code


class OpenFence:
    """The lines of one open fence's kept runs, at one width and theme: `draw` reuses them while the code grows."""

    def __init__(self) -> None:
        self._runs: list[tuple[str, list[Strip]]] = []  # (a run's code, its lines), from the first line on
        self._for: tuple[str, int, str] | None = None  # (lexer, width, theme) the runs were drawn with

    @property
    def drew(self) -> bool:
        """Whether it has drawn a block (its lines are then not Rich's whole drawing of it)."""
        return self._for is not None

    def draw(self, console: Console, options: ConsoleOptions, lexer: str, code: str, theme: str) -> list[Strip]:
        """The block's lines: padded as Rich pads a code block (a row above and below, a column each side)."""
        width = options.max_width
        if self._for != (lexer, width, theme):
            self._runs, self._for = [], (lexer, width, theme)
        lines = code.split("\n")
        whole_runs = (len(lines) - 1) // RUN  # (the last line may be half written: it is never in a kept run)
        runs = ["\n".join(lines[i * RUN:(i + 1) * RUN]) for i in range(whole_runs)]
        kept = common_prefix([run for run, _ in self._runs], runs)
        del self._runs[kept:]
        for i in range(kept, whole_runs):
            self._runs.append((runs[i], _draw(console, options, runs[i], lexer, theme, top=i == 0, bottom=False)))
        runs_shown = self._runs
        tail = "\n".join(lines[whole_runs * RUN:]).rstrip()  # (as Rich strips a code block's end)
        if not tail and runs_shown:  # (the last whole run then ends the block)
            *runs_shown, (tail, _) = runs_shown
            tail = tail.rstrip()
        last = _draw(console, options, tail, lexer, theme, top=not runs_shown, bottom=True)
        return [line for _, drawn in runs_shown for line in drawn] + last


def _draw(console: Console, options: ConsoleOptions, code: str, lexer: str, theme: str, *, top: bool,
          bottom: bool) -> list[Strip]:
    syntax = Syntax(code, lexer, theme=theme, word_wrap=True, padding=(int(top), 1, int(bottom), 1))
    return [Strip(line, options.max_width) for line in console.render_lines(syntax, options, pad=True)]
