"""ssd-chat: the product around the engine (CLI, REPL, bench; the TUI comes later)."""

__version__ = "0.1.0"
