"""Sending a prompt and streaming its reply: a worker thread feeds the engine's events into a ReplyBuffer, and a
timer drains it into the transcript and the panel when its FlushPacer says (every 0.1 s, or less often where the
renders take the engine's CPU: flush_pacer.py). A mixin of ChatApp."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from textual import work
from textual.notifications import SeverityLevel

from engine.errors import EngineError, PromptTooLongError
from engine.outputs import FEWER_THREADS, FinishReason
from engine.sampling_params import SamplingParams
from ssd_chat.context_window import context_cut_notice, fit, moved_notice, prompt_refusal
from ssd_chat.history import ChatMessage, TurnStats
from ssd_chat.reply_settings import ReplySettings
from ssd_chat.tui.commands import as_typed, prompt_text
from ssd_chat.tui.engine_worker import ReplyBuffer, stream_reply
from ssd_chat.tui.flush_pacer import FlushPacer
from ssd_chat.tui.live_stats import LiveStats
from ssd_chat.tui.messages import ReplyDone, ReplyFailed
from ssd_chat.tui.settings_fit import sampling_params
from ssd_chat.tui.widgets.prompt_input import PromptInput
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.transcript import AssistantMessage, Transcript

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object

log = logging.getLogger(__name__)
TICK_S = 0.05  # how often the flush timer asks the pacer
FLUSH_S, FLUSH_MAX_S = 0.1, 0.5  # the reply and the panel update at most 10 and at least 2 times a second,
UI_SHARE = 0.1  # and with the engine on the CPU, the UI thread's CPU for it stays near this share of a core
SYSTEM_FIX = "/system TEXT sets a shorter system prompt, /system alone removes it"
ENGINE_FAILED = "engine failed"  # a partial reply's finish reason where the engine died under it
PARTIAL_KEPT = "; the partial reply is kept (F5 writes it again once the engine runs)"
PARTIAL_CONTINUED = "; what it added to the reply is kept (/continue goes on once the engine runs)"
CONTEXT_CUT_FIX = ("a next prompt (\"go on\") continues it, the earliest turns then out of the model's view; /clear "
                   "starts afresh")


def length_cut_notice(max_tokens: int) -> str:
    return (f"the reply stopped at its limit of {max_tokens:,} tokens: /continue writes more of it, /max-tokens N "
            f"raises the limit")


class ReplyActions(_Base):
    regenerating = False  # /regen's reply is under way (a refusal or a stop before its first token brings the old back)
    reply_settings: ReplySettings | None = None  # the running reply's, as it started (a /temp meanwhile: the next's)
    live_tok_s = 0  # the running reply's decode speed as the status line shows it (0: none yet)
    continuing: ChatMessage | None = None  # the reply /continue goes on with, as it was (None: a new reply runs)
    _before_continue: tuple[int, int] = (0, 0)  # the model's view and the reply's token pieces before the continue

    def send_typed(self, typed: str) -> None:
        """Send a prompt as typed (the caller checked we are idle): as the edit of the last prompt where one is open."""
        self.prompt_to_restore = None  # (answered now: a later /restart has nothing to bring back)
        text = prompt_text(typed)
        if self.current_edit() is not None:
            self.send_edit(text)
        else:
            self.send_prompt(text)

    def send_prompt(self, text: str, *, replace: bool = False) -> None:
        """Add `text` as the next turn (`replace`: in place of the last one, whose views the caller removed) and
        stream the reply (the caller checked we are idle)."""
        params = sampling_params(self.session.settings)
        if replace:
            self.session.replace_turn(text)
        else:
            self.session.add_prompt(text)
        transcript = self.query_one(Transcript)
        transcript.add_user(text)
        self._start_reply(transcript.add_assistant(colours=self.colours), params)

    def continue_last_reply(self) -> None:
        """/continue: write more of the last reply, in its own view and turn (the caller checked we are idle and that
        the chat ends with a reply)."""
        view = self.query_one(Transcript).last_assistant()
        assert view is not None and self.session.messages[-1].role == "assistant"
        self.continuing = self.session.messages[-1]
        self._before_continue = (self.session.window, len(view.pieces))
        view.set_stats("continuing…")
        self._start_reply(view, sampling_params(self.session.settings), continue_reply=True)

    def _start_reply(self, view: AssistantMessage, params: SamplingParams, *, continue_reply: bool = False) -> None:
        self.reply_view = view
        s = self.session.settings
        k = self.drafted_k()  # the panel's rows: what a round drafts at most (/k 32 on the CPU: 31)
        self.reply_settings = ReplySettings.of(s, k)
        self.buffer = ReplyBuffer(LiveStats(s.mode, k, started=self.clock()), self.clock)
        self.pacer = FlushPacer(FLUSH_S, FLUSH_MAX_S, None if self.engine.config.on_cuda else UI_SHARE)
        self._flush_timer = self.set_interval(TICK_S, self._flush_tick)
        self.refresh_status()
        self._reply(params, self.buffer, self.speculation(), continue_reply)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _reply(self, params: SamplingParams, buffer: ReplyBuffer, spec, continue_reply: bool) -> None:
        assert self.engine is not None
        try:
            self.engine.speculation = spec  # between requests, on the engine's own thread
            messages = self._window(params)
            output = stream_reply(self.engine, messages, params, buffer, continue_reply=continue_reply)
        except PromptTooLongError as err:
            self.post_message(ReplyFailed(str(err) if continue_reply else prompt_refusal(
                self.engine, self.session.engine_messages(), SYSTEM_FIX, str(err))))
        except EngineError as err:
            self.post_message(ReplyFailed(str(err)))
        except Exception as err:  # the engine died (a killed process, a bug): keep the conversation
            if not self.quitting:  # else action_quit stopped it
                log.info("the engine failed", exc_info=True)  # (the notice says so; its traceback: -v, after the app)
            self.post_message(ReplyFailed(f"the engine failed: {err}", engine_failed=True))
        else:
            self.finished = output  # for a quit that cannot wait for the message
            self.post_message(ReplyDone(output))

    def _window(self, params: SamplingParams) -> list[dict[str, str]]:
        """The messages the model sees (ssd_chat.context_window); on the worker (it tokenizes the turns)."""
        session = self.session
        start = fit(self.engine, session.engine_messages(), session.window, params.max_tokens)
        messages = session.engine_messages(start)
        if start > session.window:
            self.call_from_thread(self.notify, moved_notice(self.engine.max_model_len, start) + " (all stay here)",
                                  timeout=8)
        session.set_window(start)
        return messages

    async def _flush_tick(self) -> None:
        if self.pacer.due(time.monotonic()):
            await self._flush_reply()

    async def _flush_reply(self) -> None:
        if self.buffer is None or self.reply_view is None:
            return
        self.pacer.flushed(time.monotonic())
        drained = self.buffer.drain()
        tok_s = round(drained.panel.tok_s)
        if drained.prefill != self.prefill or tok_s != self.live_tok_s:
            self.prefill, self.live_tok_s = drained.prefill, tok_s
            self.refresh_status(layout=False)  # (the settings did not change)
        await self.reply_view.append(drained.text, drained.pieces)
        self.query_one(StatsPanel).show(drained.panel)
        for warning in drained.warnings:
            self.notify(warning, severity="warning", timeout=8)
        self.draft_lost |= drained.draft_lost
        if drained.draft_lost and self.session.settings.mode != "ar":  # the mode's replies run in AR now: say so
            self.session.fall_back(mode="ar")  # (for this run: /restart, with a new draft process, brings it back)
            self.refresh_status()

    def _end_reply(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        self.buffer = None
        self.reply_view = None
        self.continuing = None
        self.prefill = None
        self.live_tok_s = 0
        self.refresh_status()
        self.warm_if_due()  # (a /system change while it ran: the conversation under it, this reply included)

    async def on_reply_done(self, message: ReplyDone) -> None:
        if self.buffer is None or self.finished is not message.output:
            return  # handled already (a quit took it first)
        self.finished = None
        await self._flush_reply()
        assert self.reply_view is not None
        output = message.output
        if output.finish_reason is FinishReason.CANCELLED and not output.token_ids:
            self._stopped_before_reply()
            return
        if self.continuing is not None and not output.text and output.finish_reason is FinishReason.STOP:
            self._continued_nothing("the reply had nothing more to add")  # (an end of turn at once: it was whole)
            return
        stats = TurnStats.from_output(output, self.reply_settings)
        fewer = f" · {FEWER_THREADS}" if self.buffer.stats.fewer_threads else ""  # (the panel's note; none under 90
        text = output.text if self.continuing is None else self.continuing.content + output.text  # (columns)
        self.reply_view.finish(text, stats.line() + fewer)
        self.query_one(StatsPanel).show(self.buffer.stats.final(output))
        self._keep_reply(text, stats)
        if output.finish_reason is FinishReason.CANCELLED:
            self.notify("reply stopped; the partial text is kept", timeout=3)
        elif output.finish_reason is FinishReason.LENGTH:  # (the stats line says "stopped: length", no more)
            assert self.reply_settings is not None
            self.notify(length_cut_notice(self.reply_settings.max_tokens), timeout=8)
        elif output.finish_reason is FinishReason.CONTEXT:  # (the stats line says "stopped: context", no more)
            assert self.engine is not None
            self.notify(context_cut_notice(self.engine.max_model_len, CONTEXT_CUT_FIX), severity="warning",
                        timeout=10)
        self._end_reply()

    def _keep_reply(self, text: str, stats: TurnStats) -> None:
        """The reply (or the last one, continued) into the conversation and the history."""
        if self.continuing is not None:
            self.session.extend_reply(text, stats)
        else:
            self.session.add_reply(text, stats)
        self.replacing_draft, self.regenerating = None, False

    def _stopped_before_reply(self) -> None:
        """Esc (or Ctrl+Q) before the reply's first token, while the engine read the prompt: no turn, as for a
        refused prompt (an empty reply went to the model with every later prompt), the prompt back in the input."""
        if self.continuing is not None:
            self._continued_nothing("stopped before the reply went on")
            return
        prompt, typed = self._take_back_prompt()
        kept = " (Ctrl+Z brings back what you had typed)" if typed else ""
        back = "the prompt is back in the input" if prompt is not None else "the reply it was to replace is back"
        self.notify(f"stopped before the reply began: {back}{kept}", timeout=6)
        self._end_reply()
        self.show_last_figures()

    def _take_back_prompt(self) -> tuple[str | None, bool]:
        """The pending prompt out of the conversation and back into the input, as typed; returns it, and whether
        the input held text typed meanwhile. /regen's prompt goes nowhere (None): the turn it was to replace is
        back, in the conversation and on screen."""
        self.query_one(Transcript).remove_last(2)
        prompt = as_typed(self.session.drop_prompt())
        if self.regenerating:
            self.regenerating = False
            self.show_conversation()
            return None, False
        typed = self.query_one(PromptInput).bring_back(prompt)  # (text typed during the reply: one Ctrl+Z away)
        self.edit_failed()  # (a sent edit: its turn is back, and the edit goes on)
        return prompt, typed

    def _continued_nothing(self, notice: str, *, severity: SeverityLevel = "information") -> None:
        """A /continue that wrote nothing: the reply as it was, its stats line back."""
        assert self.continuing is not None and self.reply_view is not None
        stats = self.continuing.stats
        window, pieces = self._before_continue
        self.session.set_window(window)  # (the continue's fit may have moved it)
        del self.reply_view.pieces[pieces:]  # (the colours view: what it streamed goes too)
        self.reply_view.finish(self.continuing.content, "" if stats is None else stats.line())
        self.notify(notice, severity=severity, timeout=6 if severity == "information" else 10)
        self._end_reply()
        self.show_last_figures()

    async def on_reply_failed(self, message: ReplyFailed) -> None:
        if self.buffer is None:
            return  # handled already (a quit took it first)
        if message.engine_failed or not self.engine_alive:  # (its pipe can tell first)
            await self._flush_reply()
            before = "" if self.continuing is None else self.continuing.content
            wrote = self.reply_view is not None and self.reply_view.text.strip() and self.reply_view.text != before
            if wrote and not self.session.replacing:  # (F5's or an edit's: the turn it was to replace comes back)
                self._keep_partial_reply(message.error)
                return
        if self.continuing is not None:
            self._continued_nothing(f"not continued: {self.failure_notice(message.error)}", severity="error")
            return
        prompt, typed = self._take_back_prompt()
        if prompt is not None and (message.engine_failed or not self.engine_alive):  # (its pipe can tell first)
            self.prompt_to_restore = prompt  # /restart, typed over it, brings it back once loaded
        kept = " (Ctrl+Z brings back what you had typed)" if typed else ""
        self.notify(self.failure_notice(message.error) + kept, title="not sent", severity="error", timeout=10)
        self._end_reply()
        self.show_last_figures()  # (the refused reply's live figures, all zeros, showed while it was tried)

    def _keep_partial_reply(self, error: str) -> None:
        """The engine died mid-reply: what it had written stays, as a reply stopped there ("stopped: engine failed",
        its figures as far as they went), in the chat and the history; /restart, then F5, writes it again."""
        assert self.buffer is not None and self.reply_view is not None
        live = self.buffer.stats.snapshot()
        stats = TurnStats(
            mode=live.mode, decode_tok_s=live.tok_s, ttft_s=live.ttft_s or 0.0, generated_tokens=live.generated_tokens,
            prompt_tokens=0, reused_prefix_tokens=0, finish_reason=ENGINE_FAILED, tau=live.tau,
            acceptance_rate=live.acceptance_rate, cache_hit_rate=live.cache_hit_rate, tau_on_hit=live.tau_on_hit,
            tau_on_miss=live.tau_on_miss, settings=self.reply_settings,
        )  # (the seed: the chat's where it has one; a drawn one the engine had not told yet)
        text = self.reply_view.text
        self.reply_view.finish(text, stats.line())
        self._keep_reply(text, stats)
        kept = PARTIAL_CONTINUED if self.continuing is not None else PARTIAL_KEPT
        self.notify(self.failure_notice(error) + kept, title="reply cut", severity="error", timeout=10)
        self._end_reply()
