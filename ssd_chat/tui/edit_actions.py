"""Editing the last prompt (F4, /edit): the prompt comes back into the input and its turn stays, marked, until
the edit is sent (the turn is replaced then) or Esc cancels it (whatever was typed before comes back). Nothing is
lost on the way: not the turn, which an edit that is never sent leaves in the history, and not a half-typed
message, which waits for the edit to end. A mixin of ChatApp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ssd_chat.history import ChatMessage, Conversation
from ssd_chat.tui.commands import as_typed
from ssd_chat.tui.widgets.prompt_input import PromptInput, send_key
from ssd_chat.tui.widgets.transcript import Transcript

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object


def editing_notice(enter_sends: bool) -> str:
    """What F4 says: the key that sends is the run's (Ctrl+S with `--enter newline`, where Enter breaks the line)."""
    return f"editing the last prompt: {send_key(enter_sends)} sends it in place of the last turn, Esc cancels"


@dataclass(frozen=True)
class Edit:
    """An edit under way: the turn it replaces (the very message objects) and the input's text before it."""

    conversation: Conversation
    turn: tuple[ChatMessage, ...]
    draft: str

    def applies_to(self, conversation: Conversation, messages: list[ChatMessage]) -> bool:
        """The conversation still ends with that turn (a regenerate, an undo or another chat end the edit)."""
        tail = messages[len(messages) - len(self.turn):]
        return (conversation is self.conversation and len(tail) == len(self.turn)
                and all(a is b for a, b in zip(tail, self.turn, strict=True)))


class EditActions(_Base):
    edit: Edit | None = None
    replacing_draft: str | None = None  # a sent edit's draft, its reply under way (a failure brings the edit back)

    def action_edit_last(self) -> None:
        if not self.ready_and_idle():
            return
        if self.current_edit() is not None:
            self._tell_editing()
            return
        turn = self.session.last_turn()
        if not turn:
            self.notify("no prompt to edit yet", severity="warning")
            return
        prompt = self.query_one(PromptInput)
        self.edit = Edit(self.session.conversation, turn, prompt.text)
        prompt.replace_text(as_typed(turn[0].content))
        self._mark_turn(True)
        self._tell_editing()
        self.refresh_status()

    def resume_edit(self, text: str, draft: str) -> bool:
        """An edit a quit kept (draft_actions): it goes on, `text` in the input and `draft`, what the input held
        before F4, kept for after it. Whether the input held typed text (one Ctrl+Z away, as bring_back says)."""
        self.edit = Edit(self.session.conversation, self.session.last_turn(), draft)
        typed = self.query_one(PromptInput).bring_back(text)
        self.mark_edited_turn()
        send = send_key(self.query_one(PromptInput).enter_sends)
        self.notify(f"your edit of the last prompt is back: {send} sends it in place of the last turn, Esc cancels"
                    + (" (Ctrl+Z brings back what you had typed)" if typed else ""), timeout=6)
        self.refresh_status()
        return typed

    def mark_edited_turn(self) -> None:
        """The edit's turn dimmed (again, once show_conversation rebuilt the transcript: a --resume's edit waits
        for the models to load)."""
        if self.current_edit() is not None:
            self._mark_turn(True)

    def _tell_editing(self) -> None:
        self.notify(editing_notice(self.query_one(PromptInput).enter_sends), timeout=4)

    def current_edit(self) -> Edit | None:
        """The edit under way, if the conversation still ends with its turn (else it is dropped)."""
        if self.edit is not None and not self.edit.applies_to(self.session.conversation, self.session.messages):
            self._mark_turn(False)
            self.edit = None
        return self.edit

    def cancel_edit(self) -> bool:
        """Esc while editing (and before anything else that changes the chat: regenerate, undo, clear, a new or
        another chat, a restart): the turn stays and the input gets back what it held before F4, undoably.
        False: no edit."""
        edit = self.edit
        if edit is None:
            return False
        self._mark_turn(False)
        self.edit = None
        self.query_one(PromptInput).replace_text(edit.draft)
        self.notify("edit cancelled: the last turn stays", timeout=3)
        self.refresh_status()
        return True

    def send_edit(self, text: str) -> None:
        """Send `text` in place of the edited turn (ChatSession.replace_turn), then give the input back what it held
        before F4."""
        edit = self.current_edit()
        assert edit is not None
        self._mark_turn(False)
        self.edit, self.replacing_draft = None, edit.draft
        self.query_one(Transcript).remove_last(len(edit.turn))
        self.send_prompt(text, replace=True)
        if edit.draft.strip():
            self.query_one(PromptInput).set_text(edit.draft)

    def edit_failed(self) -> None:
        """The reply to a sent edit failed: the session put the turn back; so do the views, and the edit goes on
        (the edited prompt back in the input, the draft kept for after it)."""
        draft, self.replacing_draft = self.replacing_draft, None
        if draft is None:
            return
        self.show_conversation()
        self.edit = Edit(self.session.conversation, self.session.last_turn(), draft)
        self._mark_turn(True)  # (the edited prompt is in the input already: on_reply_failed put it back)
        self.refresh_status()

    def _mark_turn(self, on: bool) -> None:
        """Dim the turn an edit would replace (its views are the transcript's last ones)."""
        if self.edit is None:
            return
        for view in list(self.query_one(Transcript).children)[-len(self.edit.turn):]:
            view.set_class(on, "replaced")
