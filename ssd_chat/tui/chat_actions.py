"""What the user can ask for besides sending a prompt: a typed line's dispatch (a prompt, or a slash command:
slash_actions), modes and settings, new / open / regenerate, export and help. A mixin of ChatApp."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import SystemCommand
from textual.screen import Screen

from engine.config import SpeculationConfig
from engine.errors import EngineError
from ssd_chat.history_search import first_match
from ssd_chat.tui import settings_fit
from ssd_chat.tui.commands import (
    SlashError,
    as_typed,
    is_slash,
    parse_slash,
)
from ssd_chat.tui.engine_worker import available_modes
from ssd_chat.tui.export import document, export_path
from ssd_chat.tui.live_stats import saved_panel
from ssd_chat.tui.palette import palette_commands
from ssd_chat.tui.screens.chats import ChatsScreen, OpenChat
from ssd_chat.tui.screens.help import HelpScreen
from ssd_chat.tui.widgets.prompt_input import PromptInput, key_hints
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.transcript import Shown, Transcript

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object


def key_label(key: str) -> str:
    """"ctrl+g" -> "Ctrl+G", "escape" -> "Esc", "f5" -> "F5"."""
    return "+".join({"escape": "Esc", "ctrl": "Ctrl"}.get(p, p.upper() if len(p) <= 2 else p) for p in key.split("+"))


RESTART = "/restart, or Restart in the palette (Ctrl+P), loads it again (the conversation stays)"
ENGINE_STOPPED = f"the engine's process stopped: {RESTART}"


def engine_stopped(engine: object) -> str:
    """ENGINE_STOPPED, saying how the engine's process ended where it can (EngineProcess.stop_reason)."""
    why = getattr(engine, "stop_reason", None)
    return f"{why}: {RESTART}" if why else ENGINE_STOPPED


DRAFT_GONE = "the draft process is gone, so SD and SSD run as AR: /restart starts a new one"
COMPARE_RUNNING = "a compare is running: Esc stops it"
COMPARE_ENDING = "the compare is ending (most of a second): try again then; a prompt sent now goes next"
NEXT_REPLY = "from the next reply"  # a setting changed while a reply runs: that reply keeps the one it started with


class ChatActions(_Base):
    refused = False  # ready_and_idle said no (since submit ran a slash command: its line then stays in the input)

    def ready_and_idle(self) -> bool:
        """Whether the engine is loaded, alive and free; if not, a notification says why."""
        if self.engine is None:
            self.notify("the model is still loading", severity="warning")
        elif not self.engine_alive:
            self.notify(engine_stopped(self.engine), severity="error")
            self.refresh_status()
        elif self.buffer is not None:
            self.notify("a reply is running: Esc stops it", severity="warning")
        elif self.busy:  # a compare: on its screen, or closed and ending (its stopped row, then its restore)
            self.notify(COMPARE_RUNNING if self.compare_shown() else COMPARE_ENDING, severity="warning")
        else:
            return True
        self.refused = True
        return False

    def submit(self, text: str) -> None:
        typed, text = text, text.strip()
        if not text:
            return
        if is_slash(text):
            rest = self.query_one(PromptInput).take(typed)
            self.refused = False
            try:
                command = parse_slash(text)
                run = getattr(self, f"slash_{command.name.replace('-', '_')}")
                if command.force:  # (/export! only: parse_slash refuses a ! elsewhere)
                    run(command.arg, force=True)
                else:
                    run(command.arg)
            except (SlashError, EngineError) as err:
                self.notify(str(err), severity="error")
                self.refused = True
            if self.refused:  # a bad line, or one that must wait (a reply runs): it stays to fix or send again
                self.query_one(PromptInput).set_text(text + ("\n" + rest if rest else ""))
            return
        if self.queue_after_compare(typed):  # a closed compare still restoring the cache: it goes next
            return
        if not self.ready_and_idle():
            if not self.engine_alive:  # it stays in the input; /restart typed over it brings it back when loaded
                self.prompt_to_restore = typed
            return
        self.query_one(PromptInput).take(typed)
        self.send_typed(typed)

    def speculation(self) -> SpeculationConfig:
        """The run's configuration (--backup, --fixed-k, ...) with this chat's mode, k and fan-out."""
        return settings_fit.speculation(self.session.settings, self.base_speculation, self.max_draft)

    def change_settings(self, **changes) -> None:
        """Validate first (SpeculationConfig / SamplingParams raise one-line EngineErrors), then apply."""
        settings_fit.check(replace(self.session.settings, **changes), self.base_speculation, self.vocab_size,
                           self.max_draft)
        self.session.update_settings(**changes)
        self.refresh_status()

    def fit_settings(self) -> None:
        """A chat saved with a value this version (or model) refuses: settings_fit's defaults, saved, and a notice."""
        changes, notice = settings_fit.fit(self.session.settings, self.base_speculation, self.run_settings,
                                           self.vocab_size, self.max_draft)
        if notice is not None:
            self.notify(notice, severity="warning", timeout=15)
            self.session.update_settings(**changes)
            self.refresh_status()

    def set_mode(self, mode: str) -> None:
        if self.engine is None:
            return
        if mode not in available_modes(self.engine):
            raise SlashError(f"mode {mode.upper()} needs a draft model: start with --draft")
        if mode != "ar" and self.draft_lost:  # (its replies would run AR under its name)
            self.notify(DRAFT_GONE, severity="warning")
            return
        self.change_settings(mode=mode)
        self.notify(f"mode {mode.upper()}{self.from_next_reply()}", timeout=2)

    def from_next_reply(self) -> str:
        """What a settings notice adds while a reply (or a compare) runs: it keeps the settings it started with, where
        the status line and the panel show the new ones at once."""
        return f" ({NEXT_REPLY})" if self.busy else ""

    def show_conversation(self) -> None:
        """Rebuild the transcript from the session (after open / new / clear)."""
        # (a reply's stats line goes in with it: set after a refresh, it could find the reply removed by the next
        # rebuild, Ctrl+N right after opening a chat, and that crashed the app)
        self.query_one(Transcript).show([Shown(m.role, m.content, "" if m.stats is None else m.stats.line())
                                         for m in self.session.messages if m.role in ("user", "assistant")],
                                        colours=self.colours)
        self.mark_edited_turn()  # (edit_actions)
        self.show_last_figures()
        self.refresh_status()

    def show_found(self, search: str) -> None:
        """After opening a chat from a search: its first message that holds the search (the one the list showed)
        shown and marked a moment (it opened at its end)."""
        messages = self.session.messages
        index = first_match([m.content for m in messages], search)
        if index is not None:
            transcript = self.query_one(Transcript)
            transcript.show_found(*transcript.views_of(index, 1, len(messages)))

    def show_last_figures(self) -> None:
        """The panel shows the last reply's figures as the history keeps them (none: an empty panel)."""
        reply = self.session.last_reply()
        self.query_one(StatsPanel).show(None if reply is None or reply.stats is None else saved_panel(reply.stats))

    # -- key actions -------------------------------------------------------------------------------
    def fit_mode(self) -> None:
        """A chat saved in SD or SSD, opened where no draft is loaded (--resume, Ctrl+O): AR, with a notice (its
        every send was refused, and Ctrl+G could not leave the mode), for this run only (it was saved into the
        chat, which the next run with a draft opened in AR)."""
        mode = self.session.settings.mode
        if self.engine is not None and mode not in available_modes(self.engine):
            self.notify(f"mode {mode.upper()} needs a draft model: using AR (the chat keeps {mode.upper()} for a "
                        "run with --draft)", severity="warning")
            self.session.fall_back(mode="ar")
            self.refresh_status()

    def action_cycle_mode(self) -> None:
        if self.engine is None:
            return
        modes = available_modes(self.engine)
        if len(modes) == 1:
            self.fit_mode()
            self.notify("only AR: start with --draft to use SD and SSD", severity="warning")
            return
        current = self.session.settings.mode
        self.set_mode(modes[(modes.index(current) + 1) % len(modes)] if current in modes else "ar")

    def action_new_chat(self) -> None:
        if self.ready_and_idle():
            self.cancel_edit()
            self.session.new()
            self.show_conversation()

    def action_chats(self, search: str = "") -> None:
        if self.session.store is None and self.history_off is not None:
            self.notify_history_off()
            return
        if not self.ready_and_idle() or self.session.store is None:
            return
        self.cancel_edit()
        self.session.save()  # (a save that failed before, tried again: the list shows the chat; unchanged: no write)

        def opened(chosen: OpenChat | None) -> None:
            store = self.session.store
            if chosen is not None and store is not None and (found := store.load(chosen.id)):
                unanswered = self.session.open(found)
                self.fit_settings()
                self.fit_mode()
                self.show_conversation()
                self.show_found(chosen.found)
                self.warm_cache()
                if unanswered:  # (saved so by an earlier version)
                    typed = self.query_one(PromptInput).bring_back(as_typed(unanswered))
                    self.notify("the chat's last prompt had no reply: it is in the input"
                                + (" (Ctrl+Z brings back what you had typed)" if typed else ""), timeout=6)
                else:
                    self.bring_back_draft()  # (draft_actions)
            elif self.session.conversation.id is not None and store is not None:
                current = store.load(self.session.conversation.id)
                if current is None:
                    self.session.new()  # the open conversation was deleted
                    self.show_conversation()
                else:  # perhaps renamed in the picker (or in another window): shown, and not written back
                    self.session.renamed_in_store(current.title)
                    self.refresh_status()

        self.push_screen(ChatsScreen(self.session.store, self.session.conversation.id, search), opened)

    def action_regenerate(self) -> None:
        if self.ready_and_idle():
            self.cancel_edit()
            turn = self.session.last_turn()
            if not turn:
                self.notify("nothing to regenerate yet", severity="warning")
                return
            self.query_one(Transcript).remove_last(len(turn))
            self.regenerating = True  # (the turn stays in the history until the new reply comes: replace_turn)
            self.send_prompt(turn[0].content, replace=True)

    def action_help(self) -> None:
        send_keys = key_hints(self.query_one(PromptInput).enter_sends)
        self.push_screen(HelpScreen(send_keys, [(key_label(b.key), b.tooltip or b.description) for b in self.BINDINGS]))

    def export(self, arg: str, overwrite: bool = False, suffix: str = ".md") -> Path:
        """Write the chat as Markdown (plain text to a .txt FILE): to FILE (an existing one only with `overwrite`:
        /export!), or a new `suffix` file named from the title in a folder (the default folder without FILE)."""
        if len(arg) > 1 and arg[0] == arg[-1] and arg[0] in "'\"":  # a quoted name (spaces are fine without)
            arg = arg[1:-1]
        try:
            path = Path(arg).expanduser() if arg else self.export_dir
        except RuntimeError as err:  # ~nosuchuser
            raise SlashError(f"cannot export to {arg}: {err}") from None
        try:
            return self._export(arg, path, overwrite, suffix)
        except OSError as err:  # a name too long for the file system, a folder it may not look into, ...
            raise SlashError(f"cannot export to {path}: {err.strerror or err}") from None

    def _export(self, arg: str, path: Path, overwrite: bool, suffix: str) -> Path:
        if path.is_dir():  # a folder: a new file there, named from the title
            path = export_path(self.session.conversation, path, suffix)
        elif arg.endswith(("/", os.sep)):  # meant as a folder (Path drops the /: a file by the folder's name)
            raise SlashError(f"no folder {path}: make it first, or give a file name")
        elif path.exists() and not overwrite:
            raise SlashError(f"{path} exists: /export! {arg} replaces it, or give another name")
        try:
            path.write_text(document(self.session.conversation, path, self.drafted_k()), encoding="utf-8")
        except OSError as err:
            raise SlashError(f"cannot write {path}: {err.strerror or err}") from None
        self.notify(f"exported to {path}")
        return path

    # -- the command palette (Ctrl+P) ------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterator[SystemCommand]:
        yield from super().get_system_commands(screen)
        if self.engine is None:
            return
        for title, help_text, action in palette_commands(self):  # (ssd_chat/tui/palette.py)
            yield SystemCommand(title, help_text, self._guarded(action))

    def _guarded(self, action: Callable[[], object]) -> Callable[[], None]:
        """A palette command that fails as its slash command does: one notification (an export to a folder it
        cannot write ended the app with a traceback)."""

        def run() -> None:
            try:
                action()
            except (SlashError, EngineError) as err:
                self.notify(str(err), severity="error")

        return run
