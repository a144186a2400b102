"""The compare result: one row per mode (tok/s, TTFT, tau, cache hits, speed-up vs AR) and whether their outputs
(greedy, or sampled with one seed by the coupled race) are token-identical. Shown while it runs: each mode's row as
soon as it finishes, the running mode's token count in the status line (a long prompt's prefill: the tokens read so
far); Esc stops it or closes it (twice: closes at once). What is typed meanwhile goes into the chat's prompt
(typed_behind), shown here; q, which types a q while the compare runs, closes it once it has ended."""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ssd_chat.tui.compare import RESTORE, WARM_UP, CompareReport, CompareSnapshot
from ssd_chat.tui.typed_behind import TypedLine, type_into
from ssd_chat.tui.widgets.prompt_input import PromptArea

COLUMNS = ("mode", "decode tok/s", "TTFT ms", "tokens", "tau", "cache hits", "speed-up vs AR")
NARROW_COLUMNS = ("mode", "tok/s", "TTFT", "tokens", "tau", "hits", "vs AR")  # under NARROW terminal columns
NARROW = 90  # (at 60 the long headers cut the speed-up column off)
PHASES = {WARM_UP: "warming the prefix cache", RESTORE: "putting the chat's reply back in the cache"}


class CompareScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Stop / close")]

    def __init__(self, prompt: str, modes: tuple[str, ...], decoding: str = "greedy") -> None:
        super().__init__(classes="modal", id="compare")
        self.prompt, self.modes, self.decoding = prompt, modes, decoding
        self.report: CompareReport | None = None
        self.shown = CompareReport(prompt, ())  # the rows in the table
        self.stopping = False  # Esc pressed while it runs: the status says so until the stopped run returns

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box wide"):
            yield Static(f"[b]Compare[/b] ({self.decoding}) the last prompt in "
                         f"{', '.join(m.upper() for m in self.modes)}", markup=True)
            yield Static(self.prompt[:200], id="compare-prompt", markup=False)
            yield DataTable(id="compare-table", show_cursor=False)
            yield Static("starting…", id="compare-status")
            yield TypedLine("in the prompt once closed", id="compare-typed")

    def on_mount(self) -> None:
        self._set_columns()
        self._show_typed(self._prompt())  # (what the prompt held before Ctrl+R waits there too: it showed at a key)

    def on_resize(self) -> None:
        """The headers follow the terminal's width (short ones under NARROW columns)."""
        if self._set_columns():
            self._fill(self.shown)

    def _set_columns(self) -> bool:
        """Whether the headers changed (the table is then empty)."""
        table = self.query_one(DataTable)
        columns = NARROW_COLUMNS if self.app.size.width < NARROW else COLUMNS
        if [str(c.label) for c in table.columns.values()] == list(columns):
            return False
        table.clear(columns=True)
        table.add_columns(*columns)
        return True

    def show_progress(self, snapshot: CompareSnapshot) -> None:
        """The rows done so far and the running mode's tokens; the table is redrawn only when a row was added."""
        if self.query_one(DataTable).row_count != len(snapshot.report.rows):
            self._fill(snapshot.report)
        if self.stopping:
            return
        tokens = f" {snapshot.tokens:,} token{'' if snapshot.tokens == 1 else 's'}" if snapshot.tokens else ""
        doing = PHASES.get(snapshot.mode) or f"running {snapshot.mode.upper()}"
        if snapshot.prefill is not None:  # (as a reply's status line: a long prompt, a chunk a step)
            doing += ": reading the prompt: {:,} / {:,} tokens".format(*snapshot.prefill)
        self.query_one("#compare-status", Static).update(f"{doing}…{tokens} (Esc stops)")

    def show_report(self, report: CompareReport, *, failed: bool = False) -> None:
        self.report = report
        self._fill(report)
        identical = None if failed else report.identical
        verdict = {True: "[b $success]outputs token-identical: yes[/]",
                   False: "[b $error]outputs token-identical: NO[/]",
                   None: "outputs token-identical: – (needs two complete runs)"}[identical]
        if identical is False:  # where each parts from the first: a broken path's first wrong token
            verdict += "".join(f" · {mode.upper()} parts from {base.upper()} at token {i + 1}"
                               for mode, base, i in report.differences())
        if failed:
            verdict = "[b $error]the engine failed[/]: the rows above finished before it"
        self.query_one("#compare-status", Static).update(f"{verdict}   Esc closes")

    def _fill(self, report: CompareReport) -> None:
        self.shown = report
        table = self.query_one(DataTable)
        table.clear()
        for row in report.rows:
            speedup = report.speedup(row)
            table.add_row(
                row.mode.upper() + (" (stopped)" if row.cancelled else ""), f"{row.decode_tok_s:.1f}",
                f"{1000 * row.ttft_s:.0f}" if row.generated_tokens else "–", str(row.generated_tokens),
                "–" if row.tau is None else f"{row.tau:.2f}",
                "–" if row.cache_hit_rate is None else f"{row.cache_hit_rate:.0%}",
                "–" if speedup is None else f"{speedup:.2f}x",
            )

    def on_key(self, event: events.Key) -> None:
        """Typing goes into the chat's prompt, there once the compare closes (it was lost); q closes an ended one."""
        if event.key == "q" and self.report is not None:
            return
        area = self._prompt()
        if type_into(area, event):
            event.stop()
            self._show_typed(area)

    def on_paste(self, event: events.Paste) -> None:
        area = self._prompt()
        area.insert(event.text)
        event.stop()
        self._show_typed(area)

    def _prompt(self) -> PromptArea:
        """The chat screen's prompt, under this one."""
        return self.app.screen_stack[0].query_one(PromptArea)

    def _show_typed(self, area: PromptArea) -> None:
        self.query_one(TypedLine).show(area.text)

    def action_close(self) -> None:
        if self.report is None and not self.stopping:
            self.stopping = True
            self.query_one("#compare-status", Static).update("stopping…")
            self.app.action_stop()  # type: ignore[attr-defined]
        else:
            self.dismiss(None)
