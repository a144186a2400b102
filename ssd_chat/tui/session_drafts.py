"""The open chat's draft: the input's unsent text kept in the history at a quit and taken back into the input when the
chat opens again (ssd_chat/tui/draft_actions.py is the app's side). A mixin of ChatSession."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from ssd_chat.history import ChatSettings
from ssd_chat.history_drafts import Draft, EditDraft

if TYPE_CHECKING:
    from ssd_chat.tui.session import ChatSession

    _Base = ChatSession
else:
    _Base = object


class SessionDrafts(_Base):
    def keep_draft(self, text: str, edit: EditDraft | None = None) -> None:
        """At a quit: `text`, typed and not sent, saved as the chat's draft (--resume puts it back in the input),
        with a changed `edit` of the last prompt under way (`text` is then what the input held before F4); a new
        chat with no turn is saved for it. Blank and no edit: nothing is written (take_draft took the chat's draft
        out, and another window's quit may have left one since)."""
        if self.store is None or (not text.strip() and edit is None):
            return
        self.save(keep_empty=True)  # (a new chat, or one another window deleted, saved for it; else no write)
        try:
            if self.conversation.id is not None:  # (None: the save failed, and said so)
                self.store.save_draft(self.conversation.id, text if text.strip() else "", edit)
        except sqlite3.Error as err:
            self.on_save_error(f"the text you had not sent could not be saved ({err})")

    def take_draft(self, run_settings: ChatSettings) -> Draft:
        """The open chat's draft (Draft(): none), taken out of the history for the input (the next quit saves the
        input). A chat with no turn, saved for its draft alone, goes with it where it has nothing else of its own: no
        title and `run_settings`, those this run starts a new chat with (else, the input cleared, it stayed in Ctrl+O's
        list as an empty "New chat"): the open chat is a new one again, saved by its first reply or by the next quit's
        unsent text. A title or settings it was given keep it (dropped, they were lost at a quit with the input
        empty), and so do turns another window saved in it meanwhile (HistoryStore.drop_if_empty)."""
        if self.store is None or self.conversation.id is None:
            return Draft()
        try:
            draft = self.store.draft(self.conversation.id)
            if draft.is_empty:  # (an emptied chat, /clear's, is kept: its title and settings are the user's)
                return draft
            self.store.drop_draft(self.conversation.id)
            if not self.messages and self.store.drop_if_empty(self.conversation.id, run_settings):
                self.conversation.id, self._synced = None, None
        except sqlite3.Error:  # (the chat opens all the same: told at its first save)
            return Draft()
        return draft
