"""The open conversation: its turns and settings, kept in step with the history store.

Plain Python so the turn bookkeeping (send, reply, regenerate, edit, clear) is testable without a UI.
A conversation is written to the store on its first reply, then after every change.
"""

from __future__ import annotations

from dataclasses import replace

from ssd_chat.history import (
    UNTITLED,
    ChatMessage,
    ChatSettings,
    Conversation,
    HistoryStore,
    TurnStats,
    title_from,
)


class ChatSession:
    def __init__(self, store: HistoryStore | None, settings: ChatSettings) -> None:
        self.store = store
        self.conversation = Conversation(None, settings=settings)
        self.max_tokens = settings.max_tokens  # the run's (--max-tokens), not a chat's: a reopened chat takes it too
        self._titled = False  # the pending prompt gave the conversation its title
        self.window = 0  # the first message the model still sees (ssd_chat.context_window)

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

    def last_prompt(self) -> str | None:
        return next((m.content for m in reversed(self.messages) if m.role == "user"), None)

    # -- changing ----------------------------------------------------------------------------------
    def add_prompt(self, text: str) -> None:
        self.messages.append(ChatMessage("user", text))
        self._titled = self.conversation.title == UNTITLED  # this prompt names the chat (undone by drop_prompt)
        if self._titled:
            self.conversation.title = title_from(text)

    def add_reply(self, text: str, stats: TurnStats | None) -> None:
        self.messages.append(ChatMessage("assistant", text, stats))
        self.save()

    def drop_prompt(self) -> str:
        """Undo `add_prompt` (the request failed): returns the prompt to put back in the input."""
        assert self.messages and self.messages[-1].role == "user", "no pending prompt"
        if self._titled:
            self.conversation.title = UNTITLED
        return self.messages.pop().content

    def pop_turn(self) -> str | None:
        """Remove the last prompt and its reply; returns the prompt (None when there is no turn)."""
        while self.messages and self.messages[-1].role != "user":
            self.messages.pop()
        if not self.messages:
            return None
        prompt = self.messages.pop().content
        # the model's view starts at the latest prompt at the latest (the next send's fit moves it on if need be)
        self.window = min(self.window, max((i for i, m in enumerate(self.messages) if m.role == "user"), default=0))
        if not self.messages and self.conversation.title == title_from(prompt):
            self.conversation.title = UNTITLED  # emptied: the next prompt names it, as in a new chat
        self.save()
        return prompt

    def clear(self) -> None:
        self.messages.clear()
        self.window = 0
        self.save()

    def update_settings(self, **changes) -> ChatSettings:
        self.conversation.settings = replace(self.settings, **changes)
        self.save()
        return self.settings

    def rename(self, title: str) -> None:
        self.conversation.title = title
        self.save()

    def new(self) -> None:
        self.conversation = Conversation(None, settings=self.settings)
        self.window = 0

    def open(self, conversation: Conversation) -> str | None:
        """Make `conversation` the open one; returns a last prompt it held with no reply (saved by an earlier version
        while a reply ran), taken out of it for the input (two prompts in a row would confuse the model and F5)."""
        conversation.settings = replace(conversation.settings, max_tokens=self.max_tokens)
        self.conversation = conversation
        self.window = 0
        self._titled = False
        if self.messages and self.messages[-1].role == "user":
            return self.messages.pop().content
        return None

    def save(self) -> None:
        """Persist once the conversation has a turn (an empty new chat is not worth a history entry). A prompt
        whose reply is under way is not written: were the reply to fail, or the app to die, the history would hold
        a prompt that was never answered (a settings change mid-reply saves)."""
        if self.store is None:
            return
        saved = self.conversation
        if self.messages and self.messages[-1].role == "user":
            saved = replace(saved, messages=self.messages[:-1], title=UNTITLED if self._titled else saved.title)
        if saved.id is not None or saved.messages:
            self.conversation.id = self.store.save(saved)
