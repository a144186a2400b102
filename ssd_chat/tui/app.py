"""The chat app: transcript and prompt on the left, the live speculation panel on the right.

The engine loads in a worker thread behind a loading screen; every request runs in one exclusive
worker thread (`group="engine"`), so the UI thread never runs torch. Replies stream into a
ReplyBuffer that a timer drains when its FlushPacer says (reply_actions.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.theme import Theme
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from engine.config import SpeculationConfig
from ssd_chat import stop_signals
from ssd_chat.history import ChatSettings, HistoryStore, default_db_path
from ssd_chat.sampling_defaults import filters_text
from ssd_chat.setting_words import number_text
from ssd_chat.tui import child_stderr, preferences
from ssd_chat.tui.chat_actions import ChatActions
from ssd_chat.tui.commands import as_typed
from ssd_chat.tui.compare_actions import CompareActions
from ssd_chat.tui.draft_actions import DraftActions
from ssd_chat.tui.edit_actions import EditActions
from ssd_chat.tui.engine_actions import EngineActions
from ssd_chat.tui.engine_process import stop_loading
from ssd_chat.tui.engine_worker import ChatEngine, ReplyBuffer
from ssd_chat.tui.flush_pacer import FlushPacer
from ssd_chat.tui.log_routing import LogNotice, LogRouting
from ssd_chat.tui.messages import ReplyDone, ReplyFailed
from ssd_chat.tui.provenance import legend
from ssd_chat.tui.reply_actions import ReplyActions
from ssd_chat.tui.screens.loading import LoadingScreen
from ssd_chat.tui.session import ChatSession
from ssd_chat.tui.slash_actions import SlashActions
from ssd_chat.tui.widgets.prompt_input import PromptArea, PromptInput
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.steady import set_content
from ssd_chat.tui.widgets.transcript import AssistantMessage, Transcript

log = logging.getLogger(__name__)
QUIT_WAIT_S = 1.0  # Ctrl+Q waits this long for the reply to stop at its next step, then stops the engine's process
WATCH_S = 1.0  # how often the app checks that the engine's process is alive

KEYS = [  # the footer's order: what a narrow terminal cuts comes last; the tooltip is the help screen's line
    Binding("escape", "escape", "Stop", tooltip="stop the reply or the compare (the partial text stays); with none "
            "running, cancel an edit (F4), else clear the input (Ctrl+Z brings it back)"),
    Binding("f1", "help", "Help", tooltip="this help"),
    Binding("ctrl+g", "cycle_mode", "Mode", tooltip="next mode: AR, SD, SSD, AR... (from the next reply)"),
    Binding("ctrl+r", "compare", "Compare", tooltip="replay the last prompt in AR, SD and SSD: their speeds, and "
            "whether their outputs are token-identical"),
    Binding("ctrl+o", "chats", "Chats", tooltip="saved chats: Enter opens, / searches, r renames, d twice deletes, "
            "u brings it back"),
    Binding("ctrl+n", "new_chat", "New", tooltip="a new chat with this one's settings (this one stays in history)"),
    Binding("f5", "regenerate", "Regen", tooltip="write the last reply again (the old one stays until the new begins)"),
    Binding("f4", "edit_last", "Edit", tooltip="edit the last prompt in the input: Enter sends it in its place, Esc "
            "cancels"),
    Binding("ctrl+t", "toggle_colours", "Colours", tooltip="colour each reply token by where it came from (a "
            "legend shows above the prompt)"),
]


class KeysFooter(Footer):
    """Textual's footer, compact under 100 columns: then every key fits from 80 on (and Help from 60), without the
    command palette's key (chat.tcss), which covered the last ones."""

    def on_resize(self, event: events.Resize) -> None:
        self.compact = event.size.width < 100


class ChatApp(ReplyActions, ChatActions, SlashActions, EditActions, CompareActions, EngineActions, DraftActions,
              App[None]):
    CSS_PATH = "chat.tcss"
    TITLE = "ssd-chat"
    BINDINGS = KEYS
    # Under 90 columns the live panel steps aside (chat.tcss): the conversation and the prompt need the room.
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (90, "-wide")]

    def __init__(
        self, load_engine: Callable[[], ChatEngine], *, settings: ChatSettings, store: HistoryStore | None = None,
        target: str = "", draft: str | None = None, resume: bool = False, export_dir: Path | None = None,
        clock: Callable[[], float] = time.perf_counter, speculation: SpeculationConfig | None = None,
        given: frozenset[str] = frozenset(), enter_sends: bool | None = None, history_off: str | None = None,
    ) -> None:
        super().__init__()
        self.history_off = history_off  # why there is no history (an unreadable file): told once loaded, and by Ctrl+O
        # theme, colours and Enter from the last runs (beside the history); --enter (enter_sends) wins for this run
        data = store.path.parent if store is not None else default_db_path().parent
        self.preferences_path = data / preferences.FILE_NAME
        self.preferences = preferences.load(self.preferences_path)
        self._first_enter_sends = self.preferences.enter == "send" if enter_sends is None else enter_sends
        self.load_engine = load_engine
        self.session = ChatSession(store, settings, on_save_error=self._history_not_saved, on_copy=self._saved_as_copy)
        self.target, self.draft, self.resume = target, draft, resume
        self.given = {name: getattr(settings, name) for name in given}  # settings from the command line: they win
        self.run_settings = settings  # this run's (the command line's): a first chat's, settings_fit's defaults
        # over a resumed chat's (--resume --mode ssd: that chat, in SSD)
        # The run's settings besides a chat's own mode, k and fan-out (--backup, --fixed-k): every reply keeps them.
        self.base_speculation = speculation or SpeculationConfig()
        self.export_dir = export_dir or Path.cwd()
        self.clock = clock
        self.engine: ChatEngine | None = None
        self.buffer: ReplyBuffer | None = None
        self.finished = None  # the reply whose ReplyDone is on its way (a RequestOutput)
        self.reply_view: AssistantMessage | None = None
        self.prefill: tuple[int, int] | None = None  # (done, total) prompt tokens while a long prompt prefills
        self.compare_cancel: threading.Event | None = None
        self.warm_due = False  # a warm-up asked for while busy (warm_cache): sent once the reply or compare ends
        self.draft_lost = False  # this engine's draft process died: SD and SSD run in AR until /restart
        self.colours = False
        self._flush_timer: Timer | None = None
        self.pacer: FlushPacer | None = None  # a reply's (ReplyActions.send_prompt)
        self.log_routing = LogRouting(self)  # (a stderr handler would write over the screen)
        self.load_error: str | None = None  # why the models did not load (the app then exits with code 2)
        self.quitting = False
        self._restore_signals: Callable[[], None] = lambda: None  # (on_mount: stop signals quit the app)
        self.told_stopped = False  # the notice that the engine's process died was shown (once per engine)
        self.prompt_to_restore: str | None = None  # for the input once loaded (refused by a dead engine; unanswered)
        self.told_history_off = False

    # -- layout and start-up -----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield Static(id="legend")
                yield PromptInput(id="prompt-box", enter_sends=self._first_enter_sends, earlier=self._earlier_prompts)
                yield Static(id="status")
            yield StatsPanel(id="panel")
        yield KeysFooter()

    def _earlier_prompts(self) -> list[str]:
        return [as_typed(m.content) for m in self.session.messages if m.role == "user"]

    def on_mount(self) -> None:
        if self.preferences.theme in self.available_themes:
            self.theme = self.preferences.theme
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.log_routing.install()
        self.query_one("#legend", Static).display = False
        if self.preferences.colours:
            self.action_toggle_colours()
        if self.resume:
            self.resume_latest()  # (its unsent text in the input: draft_actions)
        self.push_screen(LoadingScreen(self.target, self.draft))
        self._load()
        self.set_interval(WATCH_S, self._watch_engine)
        self._restore_signals = stop_signals.call_in_loop(asyncio.get_running_loop(), self._stop_signal)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Notifications are plain text unless asked otherwise: many quote what was typed or named (a command's
        value, a chat's title, a path, an engine error), and read as markup ("/temp [/]") they crashed the app."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def action_help_quit(self) -> None:
        """Ctrl+C: how to quit (Textual's hint, in its markup)."""
        self.notify("Press [b]Ctrl+Q[/b] to quit the app", title="Do you want to quit?", markup=True)

    def notify_history_off(self) -> None:
        self.notify(f"the chat history is off ({self.history_off}): this run saves no chat", title="no history",
                    severity="error", timeout=10)

    def _history_not_saved(self, error: str) -> None:
        self.notify(error, title="not saved", severity="error", timeout=10)

    def _saved_as_copy(self, notice: str) -> None:
        self.notify(notice, title="saved as a copy", severity="warning", timeout=15)
        self.refresh_status()

    def _stop_signal(self, signum: int) -> None:
        """`kill` or a closed terminal: quit as Ctrl+Q does (the reply under way kept, the engine stopped)."""
        if not self.quitting:
            self.call_next(self.action_quit)

    def on_unmount(self) -> None:
        try:
            self._close_engine()  # when the app ended some other way than action_quit
        finally:
            self._restore_signals()
            self.log_routing.remove()  # (the terminal's handlers come back in run_tui, once the app has let it go)

    def on_log_notice(self, message: LogNotice) -> None:
        self.notify(message.line, severity="error" if message.error else "warning", timeout=8)

    async def action_quit(self) -> None:
        self.take_back_queued()  # a prompt waiting for a closed compare: in the input, kept with typed text
        self.quitting = True
        if self.engine is None and self.loading_screen is not None and not stop_loading():
            # an engine loading in this process (SSD_CHAT_ENGINE_PROCESS=0) cannot be stopped half-way
            self.notify("quitting once the models have loaded (loading cannot stop half-way)", timeout=30)
        self.action_stop()
        waiting = asyncio.ensure_future(self.workers.wait_for_complete())  # the engine stops at its next step
        done, _ = await asyncio.wait({waiting}, timeout=QUIT_WAIT_S)
        if not done and hasattr(self.engine, "kill"):  # a step that runs long (a first compiled one): stop its process
            self.engine.kill()
        await waiting
        if self.finished is not None:  # the stopped reply: kept in the conversation, as Esc keeps it
            await self.on_reply_done(ReplyDone(self.finished))
        elif self.buffer is not None:  # it ended in the engine's failure (killed above, or it died): what it wrote
            # stays too, as when the engine dies mid-reply (the failure's message may not come before the exit)
            await self.on_reply_failed(ReplyFailed("the engine stopped at the quit", engine_failed=True))
        self.keep_unsent()  # what the input holds: the chat's draft, for --resume (draft_actions)
        self._close_engine()
        if stop_signals.hung_up():  # (no terminal to print the engine's stderr to: its file goes)
            child_stderr.remove()
        stop_signals.exit_if_hung_up()
        self.exit()

    def warm_cache(self) -> None:
        """While the user reads and types: the engine prefills the conversation the next prompt will follow (a
        resumed or reopened chat's turns, the system prompt) into its prefix cache, so the first reply does not pay
        for it. An engine without `warm` (in this process: SSD_CHAT_ENGINE_PROCESS=0) is skipped; a busy one gets it
        once the reply or compare has ended (`warm_due`)."""
        warm = getattr(self.engine, "warm", None)
        self.warm_due = warm is not None and self.busy
        if warm is None or self.warm_due or not self.engine_alive:
            return
        messages = self.session.engine_messages(self.session.window)
        if messages:
            try:
                self.warm_due = not warm(messages, self.speculation())  # (False: an exchange still held it)
            except RuntimeError:  # (the engine's process is gone: the next request says so)
                log.debug("the engine's process took no warm-up", exc_info=True)

    def warm_if_due(self) -> None:
        """After a reply or a compare: the warm-up a change made meanwhile asked for (/system while it ran)."""
        if self.warm_due:
            self.warm_cache()

    # -- the status line and the panel ---------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.buffer is not None or self.compare_cancel is not None

    def drafted_k(self, k: int | None = None) -> int:
        """The chat's k (or `k`) as the engine drafts it, at most EngineConfig.max_draft a round (/k 32 on the CPU:
        31): the status line's, the panel's, /k's, and the export's."""
        k = self.session.settings.k if k is None else k
        return k if self.engine is None else self.engine.config.drafted_k(k)

    def refresh_status(self, *, layout: bool = True) -> None:
        """The status line, and (`layout`) the panel's layout rows, which the settings change."""
        s = self.session.settings
        state = "replying… Esc stops" if self.buffer else ("comparing…" if self.compare_cancel else "ready")
        if self.buffer and self.live_tok_s:  # (the panel shows it too, but it steps aside under 90 columns)
            state = f"replying… {self.live_tok_s:.0f} tok/s · Esc stops"
        if self.queued_prompt is not None:  # (CompareActions.queue_after_compare)
            state = "ending the compare: your prompt goes next (Esc takes it back)"
        elif self.taken_back:  # (until the compare has ended)
            state = "ending the compare: your prompt is back in the input"
        if self.buffer and self.prefill:
            state = "reading the prompt: {:,} / {:,} tokens… Esc stops".format(*self.prefill)
        state = state if self.engine_alive else "engine stopped: /restart"
        if state == "ready" and self.current_edit() is not None:
            state = "editing the last prompt: Esc cancels"
        colours = " · colours on" if self.colours else ""
        filters = filters_text(s.temperature, s.top_p, s.top_k, seed=s.seed)
        sampling = f"temp {number_text(s.temperature)}" + (f" {filters}" if filters else "")
        used = self.session.context_tokens()
        context = f" · ctx {used:,}/{self.engine.max_model_len:,}" if self.engine and used is not None else ""
        k = self.drafted_k()
        set_content(self.query_one("#status", Static),  # one line, cut with an ellipsis: the mode and state first
            Content.from_markup(  # (the title as a variable: no escape keeps "what does [/ do?" from being markup)
                f"[b]{s.mode.upper()}[/b] · {state} · k {k} · {sampling}{colours}{context} · $title",
                title=self.session.conversation.title,
            )
        )
        if layout and self.engine is not None:
            self.query_one(StatsPanel).show_layout(self.engine.layout, s, k=k)

    # -- replies -----------------------------------------------------------------------------------
    @on(PromptArea.Submitted)
    def _submitted(self, event: PromptArea.Submitted) -> None:
        self.submit(event.text)

    @on(PromptArea.PageConversation)
    def _page_conversation(self, event: PromptArea.PageConversation) -> None:
        self.query_one(Transcript).page(event.direction)  # scrolled up, it stops following a streaming reply

    def action_stop(self) -> None:
        if self.buffer is not None:
            self.buffer.cancel.set()
        if self.compare_cancel is not None:
            self.compare_cancel.set()

    def action_escape(self) -> None:
        """Esc: take back a prompt waiting for a closed compare, else stop the reply or the comparison under way, else
        cancel an edit of the last prompt, else clear the input (undoably: a refused paste of thousands of lines had
        no other quick way out)."""
        area = self.query_one(PromptArea)
        if self.take_back_queued():
            return
        if self.busy:
            self.action_stop()
        elif not self.cancel_edit() and area.text:
            area.clear()
            self.notify("input cleared: Ctrl+Z brings it back", timeout=3)

    # -- colours -----------------------------------------------------------------------------------
    def action_toggle_colours(self) -> None:
        self.colours = not self.colours
        self._show_colours()
        self.refresh_status()
        self.set_preferences(colours=self.colours)

    def _show_colours(self) -> None:
        self.query_one(Transcript).show_colours(self.colours)
        legend_line = self.query_one("#legend", Static)
        legend_line.update(legend(self.current_theme))
        legend_line.display = self.colours

    def _theme_changed(self, theme: Theme) -> None:
        if self.colours:  # the token colours are the theme's (provenance.readable)
            self._show_colours()
        self.set_preferences(theme=theme.name)

    def set_preferences(self, **changes) -> None:
        self.preferences = preferences.changed(self.preferences_path, self.preferences, **changes)
