"""The slash commands: one method per command in commands.SLASH_COMMANDS (`/name ARG` calls `slash_name(ARG)`;
a bad ARG raises SlashError, which the app shows as one notification and leaves the line in the prompt to fix).
A mixin of ChatApp."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from engine.errors import InvalidParameterError
from engine.sampling_params import MAX_SEED
from ssd_chat.history import one_line
from ssd_chat.setting_words import (
    SLASH,
    TAKES,
    check_max_tokens,
    fanout_counts,
    fanout_text,
    mode_named,
    number_text,
    typed_number,
)
from ssd_chat.tui import clipboard
from ssd_chat.tui.chat_actions import NEXT_REPLY
from ssd_chat.tui.commands import ENTER_MODES, SlashError
from ssd_chat.tui.export import code_blocks
from ssd_chat.tui.screens.turns import TurnChoice, TurnsScreen
from ssd_chat.tui.widgets.prompt_input import PromptInput
from ssd_chat.tui.widgets.transcript import Transcript

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object


class SlashActions(_Base):
    def slash_mode(self, arg: str) -> None:
        if not arg:
            raise SlashError(f"/mode takes ar, sd or ssd (now {self.session.settings.mode})")
        self.set_mode(mode_named(SLASH, arg))  # (any case: /mode SD, as --mode SD)

    def slash_k(self, arg: str) -> None:
        if not arg:
            raise SlashError(f"/k takes {TAKES['k']} (now {self.drafted_k()})")
        k, fanout = int(typed_number(SLASH, "k", arg, int)), self.session.settings.fanout
        kept = fanout if fanout is not None and len(fanout) in (1, self.drafted_k(k) + 1) else None  # (one count
        # fits any k)
        self.change_settings(k=k, fanout=kept)
        if kept != fanout:  # (it was set back without a word)
            self.notify(f"fan-out back to the default: its {len(fanout)} counts were one per accepted count of the "
                        f"old k (/fanout sets it again)", timeout=6)
        self._changed_mid_reply(f"k {self.drafted_k()}")

    def slash_fanout(self, arg: str) -> None:
        self.change_settings(fanout=fanout_counts(SLASH, arg))  # (nothing, none or default: the default)
        self._changed_mid_reply(f"fan-out {fanout_text(self.session.settings.fanout)}")

    def slash_temp(self, arg: str) -> None:
        self._set_sampling("temperature", float, arg)

    def slash_top_p(self, arg: str) -> None:
        self._set_sampling("top_p", float, arg)

    def slash_top_k(self, arg: str) -> None:
        self._set_sampling("top_k", int, arg)

    def slash_seed(self, arg: str) -> None:
        """/seed N: every sampled reply of this chat from seed N (the coupled race: the same reply in every mode, and
        again at a regen); /seed last: the seed the last reply sampled from (drawn, where the chat had none); /seed
        off: a new seed each reply (the default)."""
        now, last = self.session.settings.seed, self._last_reply_seed()
        if not arg:
            told = "" if last is None else f"; the last reply's: {last}"
            raise SlashError(f"/seed takes {TAKES['seed']} (now {'off' if now is None else now}{told})")
        if arg.lower() in ("off", "none"):
            seed = None
        elif arg.lower() == "last":
            if last is None:
                raise SlashError("/seed last: the last reply sampled from no seed (greedy, or no reply yet)")
            seed = last
        else:
            seed = _typed_seed(arg)
        self.change_settings(seed=seed)
        if seed is not None and self.session.settings.temperature == 0:
            self.notify(f"seed {seed}: replies sample from it once /temp is above 0 (greedy ones draw nothing)",
                        timeout=6)
        self._changed_mid_reply(f"seed {'off' if seed is None else seed}")

    def _last_reply_seed(self) -> int | None:
        """The seed the chat's last reply sampled from (TurnStats' settings); None: greedy, older, or none yet."""
        reply = self.session.last_reply()
        settings = None if reply is None or reply.stats is None else reply.stats.settings
        return None if settings is None else settings.seed

    def _set_sampling(self, field: str, kind: type[int] | type[float], arg: str) -> None:
        """/temp, /top-p, /top-k: the chat's `field` from `arg` (none: say what it takes and its value now)."""
        command = SLASH[field].removeprefix("/")
        if not arg:
            now = number_text(getattr(self.session.settings, field))
            raise SlashError(f"/{command} takes {TAKES[field]} (now {now})")
        self.change_settings(**{field: kind(typed_number(SLASH, field, arg, kind))})
        shown = "temperature" if field == "temperature" else command
        self._changed_mid_reply(f"{shown} {number_text(getattr(self.session.settings, field))}")

    def slash_max_tokens(self, arg: str) -> None:
        """/max-tokens N: the most tokens a reply generates, from the next reply, for this run (as --max-tokens: a
        chat opened or started later takes it too); at most the context limit, which cuts a reply anyway."""
        if not arg:
            raise SlashError(f"/max-tokens takes {TAKES['max_tokens']} (now {self.session.max_tokens:,})")
        n = int(typed_number(SLASH, "max_tokens", arg, int))
        check_max_tokens(SLASH["max_tokens"], n)
        limit = None if self.engine is None else self.engine.max_model_len
        if limit is not None and n > limit:
            raise SlashError(f"/max-tokens takes at most the context limit of {limit:,} tokens; got {n:,}")
        self.change_settings(max_tokens=n)
        self.session.max_tokens = n
        self._changed_mid_reply(f"max tokens {n:,}")
        if not self.busy:
            self.notify(f"replies generate at most {n:,} tokens", timeout=2)

    def _changed_mid_reply(self, setting: str) -> None:
        """A setting the status line shows, changed while a reply runs: a notice says the reply keeps the old value
        (as /mode's does). Between replies the status line says enough."""
        if self.busy:
            self.notify(setting + self.from_next_reply(), timeout=2)

    def slash_system(self, arg: str) -> None:
        before = self.session.settings.system
        self.change_settings(system=arg or None)
        if arg or before:
            self.warm_cache()  # the conversation under its new system prompt (skipped while a reply runs)
        if arg:
            self.notify(f"system prompt set{self.from_next_reply()}", timeout=2)
        elif before:
            was = textwrap.shorten(before, 60, placeholder=" …")
            when = f"{NEXT_REPLY}; " if self.busy else ""
            self.notify(f"system prompt removed ({when}it was: {was}); /system TEXT sets one", timeout=6)
        else:
            self.notify("no system prompt to remove: /system TEXT sets one", severity="warning")

    def slash_enter(self, arg: str) -> None:
        if arg.lower() not in ENTER_MODES:
            raise SlashError(f"/enter takes send or newline; got {arg!r}" if arg else "/enter takes send or newline")
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
        """A title is one line (the status line and the picker show one): a line break typed (Ctrl+J) or pasted in
        it is a space, as every run of whitespace is."""
        if not arg:
            raise SlashError("/rename needs a title")
        self.session.rename(one_line(arg))
        self.refresh_status()

    def slash_regen(self, arg: str) -> None:
        self.action_regenerate()

    def slash_continue(self, arg: str) -> None:
        if self.ready_and_idle():
            if not self.session.messages or self.session.messages[-1].role != "assistant":
                self.notify("no reply to continue yet", severity="warning")
                return
            self.cancel_edit()
            self.continue_last_reply()

    def slash_turns(self, arg: str) -> None:
        if not self.ready_and_idle():
            return
        if not self.session.last_turn():
            self.notify("no turn yet", severity="warning")
            return

        def chosen(choice: TurnChoice | None) -> None:
            if choice is None:
                return
            transcript = self.query_one(Transcript)
            if choice.action == "show":
                transcript.show_found(*transcript.views_of(choice.index, 1, len(self.session.messages)))
            elif self.ready_and_idle():
                self.cancel_edit()
                before = len(self.session.messages)
                prompt = self.session.delete_turn(choice.index)
                # (only those: a rebuild lost the streamed replies' token colours, and laid out the chat's
                # earlier messages)
                transcript.remove_messages(choice.index, before - len(self.session.messages), before)
                self.show_last_figures()
                self.refresh_status()
                self.warm_cache()  # (the turns after it: their KV in the prefix cache no longer follows)
                self.notify(f"turn deleted (its prompt: {textwrap.shorten(prompt, 60, placeholder=' …')})", timeout=4)

        self.push_screen(TurnsScreen(self.session.messages), chosen)

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
        """The last reply, or its code blocks, to the clipboard: through the terminal (OSC 52), so over ssh too, and on
        this desktop through its clipboard tool as well (clipboard.copy_locally). While a reply streams: the reply on
        screen, so far (it copied the one before)."""
        if arg.lower() not in ("", "code"):
            raise SlashError(f"/copy takes nothing or code; got {arg!r}")
        if self.reply_view is not None:
            text, what = self.reply_view.text, "the reply so far"
            if not text:
                raise SlashError("the reply has no text yet: /copy copies it so far once it shows")
        else:
            reply = self.session.last_reply()
            if reply is None:
                raise SlashError("no reply to copy yet")
            text, what = reply.content, "the last reply"
        if arg:
            blocks = code_blocks(text)
            if not blocks:
                raise SlashError(f"{what} has no code block: /copy copies all of it")
            text, what = "\n\n".join(blocks), f"{len(blocks)} code block{'s' * (len(blocks) > 1)}"
        self.copy_to_clipboard(text)
        tool = clipboard.copy_locally(text)
        how = f"with {tool} and the terminal" if tool else "through the terminal, where it allows OSC 52 writes"
        self.notify(f"copied {what} ({len(text):,} characters) {how}", timeout=3)

    def slash_export(self, arg: str, force: bool = False) -> None:
        self.export(arg, overwrite=force)

    def slash_help(self, arg: str) -> None:
        self.action_help()

    def slash_restart(self, arg: str) -> None:
        if self.engine is not None and not self.busy:  # a dead engine too: that is what it is for
            self.restart_engine()
        else:
            self.ready_and_idle()  # says why not (still loading, or a reply runs)


def _typed_seed(arg: str) -> int:
    """/seed's number as typed, or a SlashError in /seed's words (not a whole number, or out of range)."""
    try:
        seed = int(typed_number(SLASH, "seed", arg, int))
        if 0 <= seed <= MAX_SEED:
            return seed
    except InvalidParameterError:
        pass
    raise SlashError(f"/seed takes {TAKES['seed']}; got {arg!r}")
