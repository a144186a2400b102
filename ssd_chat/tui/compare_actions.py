"""The compare action of the app: start the replay in the engine worker, show its progress and table.
A mixin of ChatApp (see compare.py for the replay itself)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from textual import work

from ssd_chat.tui.chat_actions import DRAFT_GONE
from ssd_chat.tui.compare import CompareReport, CompareSnapshot, decoding, replay_params, run_compare
from ssd_chat.tui.engine_worker import available_modes
from ssd_chat.tui.messages import CompareDone, CompareProgress
from ssd_chat.tui.screens.compare import CompareScreen
from ssd_chat.tui.settings_fit import sampling_params
from ssd_chat.tui.widgets.prompt_input import PromptInput

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object


class CompareActions(_Base):
    queued_prompt: str | None = None  # sent while a closed compare ended: it goes as the compare's run returns
    taken_back = False  # Esc took the queued prompt back into the input while the compare still ends

    def action_compare(self) -> None:
        if not self.ready_and_idle():
            return
        conversation = self.session.engine_messages(self.session.window)  # what the model saw for the last prompt
        messages = list(conversation)
        while messages and messages[-1]["role"] != "user":
            messages.pop()
        if not messages:
            self.notify("nothing to compare yet: send a prompt first", severity="warning")
            return
        assert self.engine is not None
        modes = available_modes(self.engine)
        if modes == ("ar",):  # (one row, and no verdict: nothing to compare)
            self.notify("only AR: start with --draft to compare it with SD and SSD", severity="warning")
            return
        if self.draft_lost:  # (its SD and SSD rows would run AR under their names)
            self.notify(f"{DRAFT_GONE}, then compare", severity="warning")
            return
        self.compare_cancel = threading.Event()
        params = replay_params(sampling_params(self.session.settings), self.session.settings.max_tokens)
        self.push_screen(CompareScreen(messages[-1]["content"], modes, decoding(params)))
        self.refresh_status()
        keep = conversation if len(conversation) > len(messages) else None  # a reply to put back in the cache
        self._compare(messages, keep, self.speculation(), params, self.compare_cancel)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _compare(self, messages, keep, spec, params, cancel: threading.Event) -> None:
        assert self.engine is not None
        done = CompareReport(messages[-1]["content"], ())  # the rows finished so far, kept if the engine fails

        def progress(snapshot: CompareSnapshot) -> None:
            nonlocal done
            done = snapshot.report
            self.post_message(CompareProgress(snapshot))

        try:
            self.engine.speculation = spec
            report = run_compare(self.engine, messages, max_tokens=params.max_tokens, cancel=cancel, params=params,
                                 on_progress=progress, clock=self.clock, keep=keep)
        except Exception as err:  # EngineError or a dead engine: report, keep the chat and the rows done
            self.post_message(CompareDone(done, str(err)))
        else:
            self.post_message(CompareDone(report))

    def on_compare_progress(self, message: CompareProgress) -> None:
        if isinstance(self.screen, CompareScreen):
            self.screen.show_progress(message.snapshot)

    def compare_shown(self) -> bool:
        return any(isinstance(s, CompareScreen) for s in self.screen_stack)

    def queue_after_compare(self, typed: str) -> bool:
        """A prompt sent after Esc Esc closed a compare whose run has not returned yet (its stopped row ends, then it
        puts the chat's reply back in the prefix cache: most of a second) waits for it, out of the input, and goes as
        it returns (on_compare_done), on the cache just restored. Whether it was queued so."""
        if self.compare_cancel is None or self.compare_shown():
            return False
        self.query_one(PromptInput).take(typed)
        self.queued_prompt, self.taken_back = typed, False
        self.refresh_status()
        return True

    def take_back_queued(self) -> bool:
        """Esc, or a quit, while a prompt waits for a closed compare (queue_after_compare): the prompt back in the
        input, unsent, the cursor at its end, as if typed (what was typed meanwhile one Ctrl+Z away). Whether one
        waited."""
        typed, self.queued_prompt = self.queued_prompt, None
        if typed is None:
            return False
        self.taken_back = True
        if self.query_one(PromptInput).bring_back(typed):
            self.notify("your prompt is back in the input: Ctrl+Z brings back what you had typed", timeout=6)
        self.refresh_status()
        return True

    def _send_queued(self, *, failed: bool) -> None:
        typed, self.queued_prompt = self.queued_prompt, None
        if typed is None or self.quitting:
            return
        if failed or not self.ready_and_idle():  # (the failure's notice says why and that the prompt is back)
            self.query_one(PromptInput).bring_back(typed)
            if not self.engine_alive:
                self.prompt_to_restore = typed  # /restart, typed over it, brings it back once loaded
            return
        self.send_typed(typed)

    def on_compare_done(self, message: CompareDone) -> None:
        self.compare_cancel, self.taken_back = None, False
        self.warm_if_due()
        report, failed = message.report, message.error is not None
        if failed:
            back = " (the prompt sent meanwhile is back in the input)" if self.queued_prompt is not None else ""
            self.notify(self.failure_notice(message.error or "") + back, title="compare failed", severity="error",
                        timeout=10)
        self._send_queued(failed=failed)
        self.refresh_status()
        if not isinstance(self.screen, CompareScreen):
            return
        if failed and not report.rows:
            self.screen.dismiss(None)
        else:
            self.screen.show_report(report, failed=failed)  # (a failure keeps the rows that finished)
