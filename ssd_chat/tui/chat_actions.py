"""What the user can ask for besides sending a prompt: slash commands, modes, new / open / edit /
regenerate, export and help. A mixin of ChatApp, kept apart so the app file stays about streaming."""

from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import SpeculationConfig
from engine.errors import EngineError
from engine.sampling_params import SamplingParams
from ssd_chat.tui.commands import (
    ENTER_MODES,
    SlashError,
    as_typed,
    is_slash,
    parse_fanout,
    parse_number,
    parse_slash,
)
from ssd_chat.tui.engine_worker import available_modes
from ssd_chat.tui.export import code_blocks, export_path, to_markdown
from ssd_chat.tui.screens.chats import ChatsScreen
from ssd_chat.tui.screens.help import HelpScreen
from ssd_chat.tui.widgets.prompt_input import PromptInput, key_hints
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.transcript import Transcript

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object


def key_label(key: str) -> str:
    """"ctrl+g" -> "Ctrl+G", "escape" -> "Esc", "f5" -> "F5"."""
    return "+".join({"escape": "Esc", "ctrl": "Ctrl"}.get(p, p.upper() if len(p) <= 2 else p) for p in key.split("+"))


ENGINE_STOPPED = ("the engine's process stopped: /restart, or Restart in the palette (Ctrl+P), loads it again"
                  " (the conversation stays)")


def prompt_text(typed: str) -> str:
    """What a typed prompt sends: without the blank lines before it and the whitespace after it, its first line's
    indent kept (a pasted block of code lost it, and so its lines' relative indents); `//` sends one `/`."""
    text = re.sub(r"^(?:[ \t]*\r?\n)+", "", typed.rstrip())
    return text.replace("/", "", 1) if text.lstrip().startswith("//") else text


class ChatActions(_Base):
    def ready_and_idle(self) -> bool:
        if self.engine is None:
            self.notify("the model is still loading", severity="warning")
            return False
        if not self.engine_alive:
            self.notify(ENGINE_STOPPED, severity="error")
            self.refresh_status()
            return False
        if self.busy:
            self.notify("a reply is running: Esc stops it", severity="warning")
            return False
        return True

    def submit(self, text: str) -> None:
        typed, text = text, text.strip()
        if not text:
            return
        if is_slash(text):
            self.query_one(PromptInput).set_text("")
            try:
                command = parse_slash(text)
                if command.force:
                    self.export(command.arg, replace=True)  # the one command that takes a !
                else:
                    getattr(self, f"slash_{command.name}")(command.arg)
            except (SlashError, EngineError) as err:
                self.notify(str(err), severity="error")
                self.query_one(PromptInput).set_text(text)
            return
        if not self.ready_and_idle():
            if not self.engine_alive:  # it stays in the input; /restart typed over it brings it back when loaded
                self.prompt_to_restore = text
            return
        self.query_one(PromptInput).set_text("")
        text = prompt_text(typed)
        if self.current_edit() is not None:
            self.send_edit(text)
        else:
            self.send_prompt(text)

    def speculation(self) -> SpeculationConfig:
        """The run's configuration (--backup, --fixed-k, ...) with this chat's mode, k and fan-out."""
        s = self.session.settings
        return replace(self.base_speculation, mode=s.mode, k=s.k, fanout=s.fanout)

    def change_settings(self, **changes) -> None:
        """Validate first (SpeculationConfig / SamplingParams raise one-line EngineErrors), then apply."""
        new = replace(self.session.settings, **changes)
        replace(self.base_speculation, mode=new.mode, k=new.k, fanout=new.fanout)
        SamplingParams(temperature=new.temperature, max_tokens=new.max_tokens)
        self.session.update_settings(**changes)
        self.refresh_status()

    def set_mode(self, mode: str) -> None:
        if self.engine is None:
            return
        if mode not in available_modes(self.engine):
            raise SlashError(f"mode {mode.upper()} needs a draft model: start with --draft" if mode in ("sd", "ssd")
                             else f"unknown mode {mode!r}: ar, sd or ssd")
        self.change_settings(mode=mode)
        self.notify(f"mode {mode.upper()}" + (" (from the next reply)" if self.busy else ""), timeout=2)

    def show_conversation(self) -> None:
        """Rebuild the transcript from the session (after open / new / clear)."""
        transcript = self.query_one(Transcript)
        transcript.remove_children()
        for message in self.session.messages:
            if message.role == "user":
                transcript.add_user(message.content)
            elif message.role == "assistant":
                view = transcript.add_assistant(message.content, colours=self.colours)
                if message.stats is not None:
                    view.call_after_refresh(view.set_stats, message.stats.line())
        self.query_one(StatsPanel).show(None)
        self.refresh_status()

    # -- key actions -------------------------------------------------------------------------------
    def fit_mode(self) -> None:
        """A chat saved in SD or SSD, opened where no draft is loaded (--resume, Ctrl+O): AR, with a notice (its
        every send was refused, and Ctrl+G could not leave the mode)."""
        mode = self.session.settings.mode
        if self.engine is not None and mode not in available_modes(self.engine):
            self.notify(f"mode {mode.upper()} needs a draft model: using AR", severity="warning")
            self.session.update_settings(mode="ar")
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
        self.session.save()

        def opened(conversation_id: int | None) -> None:
            store = self.session.store
            if conversation_id is not None and store is not None and (found := store.load(conversation_id)):
                unanswered = self.session.open(found)
                self.fit_mode()
                self.show_conversation()
                if unanswered:  # (saved so by an earlier version)
                    typed = self.query_one(PromptInput).text.strip()
                    self.query_one(PromptInput).replace_text(as_typed(unanswered))
                    self.notify("the chat's last prompt had no reply: it is in the input"
                                + (" (Ctrl+Z brings back what you had typed)" if typed else ""), timeout=6)
            elif self.session.conversation.id is not None and store is not None:
                current = store.load(self.session.conversation.id)
                if current is None:
                    self.session.new()  # the open conversation was deleted
                    self.show_conversation()
                else:  # perhaps renamed in the picker: the next save must not write the old title back
                    self.session.conversation.title = current.title
                    self.refresh_status()

        self.push_screen(ChatsScreen(self.session.store, self.session.conversation.id, search), opened)

    def action_regenerate(self) -> None:
        if self.ready_and_idle():
            self.cancel_edit()
            before = len(self.session.messages)
            prompt = self.session.pop_turn()
            if prompt is None:
                self.notify("nothing to regenerate yet", severity="warning")
                return
            self.query_one(Transcript).remove_last(before - len(self.session.messages))
            self.send_prompt(prompt)

    def action_help(self) -> None:
        send_keys = key_hints(self.query_one(PromptInput).enter_sends)
        self.push_screen(HelpScreen(send_keys, [(key_label(b.key), b.description) for b in self.BINDINGS]))

    def export(self, arg: str, replace: bool = False) -> Path:
        """Write the chat as Markdown: to FILE (an existing one only with `replace`: /export!), or a new file
        named from the title in a folder (the default folder without FILE)."""
        if len(arg) > 1 and arg[0] == arg[-1] and arg[0] in "'\"":  # a quoted name (spaces are fine without)
            arg = arg[1:-1]
        path = Path(arg).expanduser() if arg else self.export_dir
        if path.is_dir():  # a folder: a new file there, named from the title
            path = export_path(self.session.conversation, path)
        elif path.exists() and not replace:
            raise SlashError(f"{path} exists: /export! {arg} replaces it, or give another name")
        try:
            path.write_text(to_markdown(self.session.conversation), encoding="utf-8")
        except OSError as err:
            raise SlashError(f"cannot write {path}: {err.strerror or err}") from None
        self.notify(f"exported to {path}")
        return path

    # -- slash commands (one method per command in commands.SLASH_COMMANDS) -------------------------
    def slash_mode(self, arg: str) -> None:
        if not arg:
            raise SlashError(f"/mode takes ar, sd or ssd (now {self.session.settings.mode})")
        self.set_mode(arg.lower())

    def slash_k(self, arg: str) -> None:
        if not arg:
            raise SlashError(f"/k takes the most draft tokens per step, 1-32 (now {self.session.settings.k})")
        self.change_settings(k=int(parse_number(arg, int, "k")), fanout=None)

    def slash_fanout(self, arg: str) -> None:
        self.change_settings(fanout=parse_fanout(arg))

    def slash_temp(self, arg: str) -> None:
        if not arg:
            raise SlashError(f"/temp takes a temperature, 0 = greedy (now {self.session.settings.temperature:g})")
        self.change_settings(temperature=float(parse_number(arg, float, "temp")))

    def slash_system(self, arg: str) -> None:
        before = self.session.settings.system
        self.change_settings(system=arg or None)
        if arg:
            self.notify("system prompt set", timeout=2)
        elif before:
            was = textwrap.shorten(before, 60, placeholder=" …")
            self.notify(f"system prompt removed (it was: {was}); /system TEXT sets one", timeout=6)
        else:
            self.notify("no system prompt to remove: /system TEXT sets one", severity="warning")

    def slash_enter(self, arg: str) -> None:
        if arg.lower() not in ENTER_MODES:
            raise SlashError(f"/enter takes send or newline, got {arg!r}" if arg else "/enter takes send or newline")
        self.query_one(PromptInput).set_enter_sends(arg.lower() == "send")
        self.set_preferences(enter=arg.lower())
        keys = "Enter sends" if arg.lower() == "send" else "Enter is a new line, Ctrl+S sends"
        self.notify(f"{keys}, from now on (--enter or SSD_CHAT_ENTER chooses for one run)", timeout=3)

    def slash_clear(self, arg: str) -> None:
        if self.ready_and_idle():
            self.cancel_edit()
            self.session.clear()
            self.show_conversation()

    def slash_new(self, arg: str) -> None:
        self.action_new_chat()

    def slash_chats(self, arg: str) -> None:
        self.action_chats(arg)

    def slash_rename(self, arg: str) -> None:
        if not arg:
            raise SlashError("/rename needs a title")
        self.session.rename(arg)
        self.refresh_status()

    def slash_regen(self, arg: str) -> None:
        self.action_regenerate()

    def slash_edit(self, arg: str) -> None:
        self.action_edit_last()

    def slash_undo(self, arg: str) -> None:
        if self.ready_and_idle():
            self.cancel_edit()
            if self.session.pop_turn() is None:
                self.notify("no turn to remove yet", severity="warning")
                return
            self.show_conversation()
            self.notify("the last prompt and its reply are removed", timeout=2)

    def slash_compare(self, arg: str) -> None:
        self.action_compare()

    def slash_colors(self, arg: str) -> None:
        self.action_toggle_colours()

    def slash_copy(self, arg: str) -> None:
        """The last reply, or its code blocks, to the clipboard: through the terminal (OSC 52), so over ssh too."""
        if arg.lower() not in ("", "code"):
            raise SlashError(f"/copy takes nothing or code, got {arg!r}")
        replies = [m for m in self.session.messages if m.role == "assistant"]
        if not replies:
            raise SlashError("no reply to copy yet")
        text, what = replies[-1].content, "the last reply"
        if arg:
            blocks = code_blocks(text)
            if not blocks:
                raise SlashError("the last reply has no code block: /copy copies all of it")
            text, what = "\n\n".join(blocks), f"{len(blocks)} code block{'s' * (len(blocks) > 1)}"
        self.copy_to_clipboard(text)
        self.notify(f"copied {what} ({len(text):,} characters; the terminal must allow OSC 52 clipboard writes)",
                    timeout=3)

    def slash_export(self, arg: str) -> None:
        self.export(arg)

    def slash_help(self, arg: str) -> None:
        self.action_help()

    def slash_restart(self, arg: str) -> None:
        if self.engine is not None and not self.busy:  # a dead engine too: that is what it is for
            self.restart_engine()
        else:
            self.ready_and_idle()  # says why not (still loading, or a reply runs)
