"""The plain mode's tests' stdin: the lines typed (input() answers them, then EOF as Ctrl-D), and the fake
engine's reply."""

from __future__ import annotations

REPLY = "Hello from the **fake** engine."  # (tui_fakes.FakeEngine's words)


def feed(monkeypatch, lines: list[str]) -> None:
    queue = iter(lines)

    def fake_input(prompt: str = "") -> str:
        try:
            return next(queue)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
