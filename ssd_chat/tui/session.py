"""The open conversation: its turns and settings, kept in step with the history store.

Plain Python so the turn bookkeeping (send, reply, regenerate, edit, clear) is testable without a UI.
A conversation is written to the store on its first reply, then after every change, and only what changed: the
session keeps the conversation as it last loaded or saved it (`_synced`), the base of HistoryStore.save. Two
windows on one chat: turns the other one saved are never written over; where this one then changes the turns
(a reply, /undo, /clear), its version is saved as a new chat, "TITLE (copy)", with a notice, and goes on there.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import replace

from ssd_chat.history import (
    UNTITLED,
    ChatChanged,
    ChatMessage,
    ChatSettings,
    Conversation,
    HistoryStore,
    TurnStats,
    title_from,
)
from ssd_chat.tui.session_drafts import SessionDrafts


class ChatSession(SessionDrafts):
    def __init__(self, store: HistoryStore | None, settings: ChatSettings,
                 on_save_error: Callable[[str], None] = lambda message: None,
                 on_copy: Callable[[str], None] = lambda message: None) -> None:
        self.store = store
        self.on_save_error = on_save_error  # told, once until a save works again, that the history took no write
        self.on_copy = on_copy  # told that another window changed this chat, and this one's went to a copy
        self._save_failed = False
        self.conversation = Conversation(None, settings=settings)
        self._synced: Conversation | None = None  # the conversation as this session last loaded or saved it
        self._run_only: dict[str, object] = {}  # the chat's own values of settings this run forced (fall_back)
        self.max_tokens = settings.max_tokens  # the run's (--max-tokens), not a chat's: a reopened chat takes it too
        self._titled = False  # the pending prompt gave the conversation its title
        self._replaced: tuple[list[ChatMessage], str, int] | None = None  # a pending edit's turn, title and window
        self.window = 0  # the first message the model still sees (ssd_chat.context_window)
        self._window_before = 0  # the window before the pending prompt's fit (drop_prompt puts it back)
        self._answered_from: dict[int, int] = {}  # a prompt's index -> the window its reply was generated with
        self._view_changed: ChatMessage | None = None  # the last reply, where a turn before it was deleted since

    # -- reading -----------------------------------------------------------------------------------
    @property
    def settings(self) -> ChatSettings:
        return self.conversation.settings

    @property
    def messages(self) -> list[ChatMessage]:
        return self.conversation.messages

    def engine_messages(self, start: int = 0) -> list[dict[str, str]]:
        """The conversation from message `start` on as the engine's chat messages (system prompt first)."""
        out = [{"role": "system", "content": self.settings.system}] if self.settings.system else []
        return out + [{"role": m.role, "content": m.content} for m in self.messages[start:]]

    def last_turn(self) -> tuple[ChatMessage, ...]:
        """The last prompt and what came after it (its reply); () when there is no prompt."""
        start = self._turn_starts()
        return tuple(self.messages[start[-1]:]) if start else ()

    def _turn_starts(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.role == "user"]

    def last_reply(self) -> ChatMessage | None:
        return next((m for m in reversed(self.messages) if m.role == "assistant"), None)

    def context_tokens(self) -> int | None:
        """The tokens in the model's view after the last reply: its prompt (the window's turns, in the chat
        template) and what it wrote; 0 before any reply; None where that is not known: the engine died in the reply
        (reply_actions' partial reply), or a turn it counted was deleted since (/turns), until the next reply."""
        reply = self.last_reply()
        stats = None if reply is None else reply.stats
        if stats is not None and (not stats.prompt_tokens or reply is self._view_changed):
            return None
        return 0 if stats is None else stats.prompt_tokens + stats.generated_tokens

    @property
    def replacing(self) -> bool:
        """Whether the pending prompt is to replace the last turn (F5, a sent F4 edit): that turn comes back if the
        reply fails (drop_prompt)."""
        return self._replaced is not None

    def last_prompt(self) -> str | None:
        return next((m.content for m in reversed(self.messages) if m.role == "user"), None)

    # -- changing ----------------------------------------------------------------------------------
    def add_prompt(self, text: str) -> None:
        self.messages.append(ChatMessage("user", text))
        self._window_before = self.window
        self._titled = self.conversation.title == UNTITLED  # this prompt names the chat (undone by drop_prompt)
        if self._titled:
            self.conversation.title = title_from(text)

    def add_reply(self, text: str, stats: TurnStats | None) -> None:
        """The pending prompt's reply; its stats keep the window it was generated with (`open` reads it back)."""
        stats = None if stats is None else replace(stats, window=self.window)
        self.messages.append(ChatMessage("assistant", text, stats))
        self._replaced = None
        self.save()

    def extend_reply(self, text: str, stats: TurnStats | None) -> None:
        """The last reply, continued (/continue): `text` in place of its text, `stats` those of the continuation."""
        assert self.messages and self.messages[-1].role == "assistant", "no reply to continue"
        self.messages.pop()  # (a new message in its place: the save compares it with the old one)
        self.add_reply(text, stats)

    def drop_prompt(self) -> str:
        """Undo `add_prompt` (the request failed): returns the prompt to put back in the input. A turn the prompt
        was to replace (`replace_turn`) comes back."""
        assert self.messages and self.messages[-1].role == "user", "no pending prompt"
        if self._titled:
            self.conversation.title = UNTITLED
        prompt = self.messages.pop().content
        self._answered_from.pop(len(self.messages), None)
        self.window = self._window_before  # a refused prompt moves no turn out of the model's view
        if self._replaced is not None:
            turn, self.conversation.title, self.window = self._replaced
            self._answered_from[len(self.messages)] = self.window
            self.messages.extend(turn)
            self._replaced = None
        return prompt

    def set_window(self, start: int) -> None:
        """The last prompt's reply (pending, or continued) is generated with messages `start`.. in view
        (ssd_chat.context_window)."""
        self.window = start
        self._answered_from[max(i for i, m in enumerate(self.messages) if m.role == "user")] = start

    def replace_turn(self, text: str) -> None:
        """`text` as the next prompt in place of the last turn, which stays in the history until the reply comes
        (and comes back if the request fails: drop_prompt)."""
        title, window = self.conversation.title, self.window
        turn = self._pop_turn()
        assert turn, "no turn to replace"
        self._replaced = (turn, title, window)
        self.add_prompt(text)

    def pop_turn(self) -> str | None:
        """Remove the last prompt and its reply; returns the prompt (None when there is no turn)."""
        turn = self._pop_turn()
        if not turn:
            return None
        self.save()
        return turn[0].content

    def delete_turn(self, start: int) -> str:
        """Remove the turn whose prompt is message `start` (the prompt and its reply, up to the next prompt); returns
        the prompt. The messages after it move up, and the model's views with them: the window, and each later
        reply's (one that began inside the turn now begins at the turn that follows it)."""
        assert self.messages[start].role == "user", "not a prompt"
        end = next((i for i in self._turn_starts() if i > start), len(self.messages))
        if end == len(self.messages):  # the last turn: as /undo
            return self.pop_turn() or ""
        n, prompt = end - start, self.messages[start].content
        del self.messages[start:end]
        if start == 0 and self.conversation.title == title_from(prompt):  # (its text goes from the chats list too)
            self.conversation.title = title_from(self.messages[0].content)

        def moved(window: int) -> int:
            return window - n if window >= end else min(window, start)

        self.window = moved(self.window)
        self._answered_from = {k - n if k >= end else k: moved(w) for k, w in self._answered_from.items()
                               if not start <= k < end}
        for i in range(start, len(self.messages)):
            stats = self.messages[i].stats
            if stats is not None and moved(stats.window) != stats.window:  # (a new message: the save compares)
                self.messages[i] = replace(self.messages[i], stats=replace(stats, window=moved(stats.window)))
        self._view_changed = self.last_reply()  # (its context count held the deleted turn)
        self.save()
        return prompt

    def _pop_turn(self) -> list[ChatMessage]:
        """Take the last prompt and what follows it out of the conversation; returns them ([]: no prompt)."""
        starts = self._turn_starts()
        if not starts:
            return []
        turn = self.messages[starts[-1]:]
        del self.messages[starts[-1]:]
        # the view the now last reply was generated with (/compare replays it; the next send's fit moves it on if
        # need be); at the latest prompt at the latest
        last = starts[-2] if len(starts) > 1 else 0
        self.window = self._answered_from.get(last, min(self.window, last))
        if not self.messages:
            self._forget_prompt_title(turn[0].content)
        return turn

    def _forget_prompt_title(self, first_prompt: str) -> None:
        """Emptied: a title the first prompt gave goes (the next prompt names the chat, as in a new chat); a chosen
        one stays."""
        if self.conversation.title == title_from(first_prompt):
            self.conversation.title = UNTITLED

    def clear(self) -> None:
        """Remove every turn; a title the first prompt gave goes too (the next prompt names the chat, as after undoing
        every turn), a chosen one stays."""
        first = next((m.content for m in self.messages if m.role == "user"), None)
        if first is not None:
            self._forget_prompt_title(first)
        self.messages.clear()
        self.window, self._answered_from = 0, {}
        self.save()

    def update_settings(self, **changes) -> ChatSettings:
        for name in changes:  # chosen now: saved, forced or not
            self._run_only.pop(name, None)
        self.conversation.settings = replace(self.settings, **changes)
        self.save()
        return self.settings

    def fall_back(self, **changes) -> None:
        """Settings this run forces on the chat (AR where no draft model is loaded): its replies use them, and its
        saves keep the chat's own, so that a run that has them opens it as it was. A setting chosen later is saved."""
        for name in changes:
            self._run_only.setdefault(name, getattr(self.settings, name))
        self.conversation.settings = replace(self.settings, **changes)

    def take_back_fallbacks(self) -> None:
        """The chat's own values of the settings `fall_back` forced, for a new engine (fit_mode forces again what it
        still lacks)."""
        self.conversation.settings = replace(self.settings, **self._run_only)
        self._run_only = {}

    def rename(self, title: str) -> None:
        self.conversation.title = title
        self.save()

    def renamed_in_store(self, title: str) -> None:
        """The history renamed this chat (the picker): its title here too, and not a change of this session's that
        a save would write."""
        self.conversation.title = title
        if self._synced is not None:
            self._synced.title = title

    def new(self) -> None:
        self.conversation = Conversation(None, settings=self.settings)
        self._synced, self._run_only = None, {}  # (a new chat's own settings: those it starts with, in this run)
        self.window, self._answered_from = 0, {}

    def open(self, conversation: Conversation) -> str | None:
        """Make `conversation` the open one; returns a last prompt it held with no reply (saved by an earlier version
        while a reply ran), taken out of it for the input (two prompts in a row would confuse the model and F5)."""
        conversation.settings = replace(conversation.settings, max_tokens=self.max_tokens)
        self.conversation = conversation
        self._synced = _copy(conversation)  # (this run's max tokens: no change to save)
        self._run_only = {}
        self._titled, self._replaced = False, None
        unanswered = self.messages.pop().content if self.messages and self.messages[-1].role == "user" else None
        # the model's view as it was (its replies' stats keep it; 0 in a chat saved before they did): recomputed, it
        # moved down to half the context, and the model saw fewer turns than before the chat was closed
        self._answered_from = {i - 1: m.stats.window for i, m in enumerate(self.messages)
                               if m.role == "assistant" and m.stats is not None and i}
        reply = self.last_reply()
        self.window = 0 if reply is None or reply.stats is None else reply.stats.window
        return unanswered

    def save(self, *, keep_empty: bool = False) -> None:
        """Persist once the conversation has a turn (an empty new chat is not worth a history entry, but for its
        draft: `keep_empty`). A prompt whose reply is under way is not written: were the reply to fail, or the app to
        die, the history would hold a prompt that was never answered (a settings change mid-reply saves)."""
        if self.store is None:
            return
        saved = self.conversation
        if self._replaced is not None:  # an edit's reply is under way: the turn it replaces is still the history's
            turn, title, _ = self._replaced
            saved = replace(saved, messages=self.messages[:-1] + turn, title=title)
        elif self.messages and self.messages[-1].role == "user":
            saved = replace(saved, messages=self.messages[:-1], title=UNTITLED if self._titled else saved.title)
        if saved.id is None and not saved.messages and not keep_empty:
            return
        if self._run_only:
            saved = replace(saved, settings=replace(saved.settings, **self._run_only))
        try:
            try:
                self.store.save(saved, self._synced)
            except ChatChanged:
                if not saved.messages:  # emptied here (/clear, /undo): the other window's turns stay, and this
                    # window goes on as a new chat, saved (and named by its first prompt) once it has a turn
                    self.conversation.id, self.conversation.title, self._synced = None, UNTITLED, None
                    return
                saved = self._save_copy(saved)
        except sqlite3.Error as err:  # a read-only or full disk, a file another program holds locked: the chat goes on
            if not self._save_failed:
                self.on_save_error(f"the chat history could not be saved ({err}): this chat stays open until you "
                                   "quit, and /export FILE writes a copy")
            self._save_failed = True
        else:
            self.conversation.id = saved.id
            self._synced = _copy(saved)
            self._save_failed = False

    def _save_copy(self, saved: Conversation) -> Conversation:
        """Another window or process saved this chat since this session loaded it: this session's version goes to
        a new chat, which it goes on with (its turns follow on each other, as the model saw them; the other
        window's stay as it saved them)."""
        copy = replace(saved, id=None, title=copy_title(saved.title))
        self.store.save(copy)
        self.conversation.title = copy.title
        self.on_copy(f'this chat was changed in another window since it was opened here: this window\'s turns are '
                     f'saved as a new chat, "{copy.title}" (Ctrl+O lists both)')
        return copy


def _copy(conversation: Conversation) -> Conversation:
    """What a save compares with: the fields as they are now (the messages themselves are frozen)."""
    return replace(conversation, messages=list(conversation.messages))


def copy_title(title: str) -> str:
    """The title of a copy: "Tea" -> "Tea (copy)" -> "Tea (copy 2)" -> "Tea (copy 3)" (not "Tea (copy) (copy)")."""
    match = re.fullmatch(r"(.*) \(copy(?: (\d+))?\)", title)
    if match is None:
        return f"{title} (copy)"
    return f"{match[1]} (copy {int(match[2] or 1) + 1})"
