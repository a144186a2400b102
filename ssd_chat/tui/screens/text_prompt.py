"""A one-line question in a modal box (rename a conversation, ...): Enter answers, Esc cancels."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class TextPrompt(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__(classes="modal")
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box"):
            yield Static(self.question)
            yield Input(self.value, id="text-prompt-input")

    @on(Input.Submitted)
    def _answer(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
