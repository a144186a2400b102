"""The unsent input kept with the chat as its draft: a quit lost what was typed and not sent (and a prompt queued
behind a closing compare, which a quit puts back in the input). A mixin of ChatApp.

At a quit (Ctrl+Q, a stop signal) the input's text is saved with the open chat (ChatSession.keep_draft; a new chat
with no turn is saved for it), which makes that chat the latest: `--resume` opens it with the text back in the
input, as it was left, and so does opening it from Ctrl+O (what was typed there then one Ctrl+Z away). A draft
comes out of the history as it goes into the input: the next quit saves the input again.

A quit in an edit of the last prompt (F4) that changed it keeps both texts: the edit, and what the input held before
F4 (history_drafts.Draft). The chat reopened, the edit goes on where it was left (the edit in the input, its turn
dimmed; Esc or sending it brings the earlier text back), where that prompt is still the chat's last; else the edit
goes in the input after the earlier text. Saving the edit alone lost the earlier text, and joining the two in one
text made the edit a new prompt to send, and the user separate them by hand.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from ssd_chat.history_drafts import Draft, EditDraft
from ssd_chat.tui.commands import as_typed
from ssd_chat.tui.screens.chats import ChatsScreen
from ssd_chat.tui.widgets.prompt_input import PromptInput

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object


class DraftActions(_Base):
    def keep_unsent(self) -> None:
        """At a quit, once the reply under way is kept: what the input holds, saved as the chat's draft. In an edit
        (F4) that changed nothing, what the input held before it: the last prompt, saved, came back as a new
        prompt to send, and the text typed before F4 was lost; in one that changed it, both (the module's
        docstring). From the chats picker, the open chat as its closing leaves it: one deleted there is gone."""
        if any(isinstance(screen, ChatsScreen) for screen in self.screen_stack):
            self._leave_if_deleted()
        text = self.query_one(PromptInput).text
        edit = self.current_edit()
        if edit is None:
            self.session.keep_draft(text)
        elif text == as_typed(edit.turn[0].content):
            self.session.keep_draft(edit.draft)
        else:  # (both: the edit, and what it will give back)
            self.session.keep_draft(edit.draft, EditDraft(text, len(self.session.messages) - len(edit.turn)))

    def _leave_if_deleted(self) -> None:
        """A new chat in place of the open one where the history no longer holds it (deleted in the picker): saved
        with its draft, it came back, every turn of it, as a chat another window deleted does."""
        store, chat_id = self.session.store, self.session.conversation.id
        try:
            if store is not None and chat_id is not None and store.load(chat_id) is None:
                self.session.new()
        except sqlite3.Error:  # (the draft's save tries, and says what failed)
            pass

    def resume_latest(self) -> None:
        """--resume: the most recent chat, its settings from the command line winning; a prompt it holds with no
        reply goes in the input once the models load, else its draft goes in now (typing while they load adds to
        it, as to any text in the input)."""
        latest = None if self.session.store is None else self.session.store.latest()
        if latest is None:
            return
        unanswered = self.session.open(latest)
        self.prompt_to_restore = None if unanswered is None else as_typed(unanswered)
        if self.given:
            self.session.update_settings(**self.given)
        if unanswered is None:
            self._put_back(self.session.take_draft(self.run_settings))

    def bring_back_draft(self) -> None:
        """A chat opened from Ctrl+O: its draft in the input, what was typed there one Ctrl+Z away."""
        draft = self.session.take_draft(self.run_settings)
        if draft.is_empty:
            return
        typed = self._put_back(draft)
        if self.current_edit() is None:  # (resume_edit says it: Ctrl+O ended any edit before)
            self.notify("the text you had not sent in this chat is back in the input"
                        + (" (Ctrl+Z brings back what you had typed)" if typed else ""), timeout=6)

    def _put_back(self, draft: Draft) -> bool:
        """`draft` in the input: its edit goes on where its prompt is still the last one (resume_edit: edit_actions),
        else it follows the draft's text. Whether the input held typed text (now one Ctrl+Z away)."""
        edit, turn = draft.edit, self.session.last_turn()
        if edit is not None and turn and edit.at == len(self.session.messages) - len(turn):
            return self.resume_edit(edit.text, draft.text)
        texts = [draft.text, "" if edit is None else edit.text]
        text = "\n\n".join(t for t in texts if t.strip())
        return bool(text) and self.query_one(PromptInput).bring_back(text)
