"""ssd-chat: the product around the engine (CLI, TUI, bench, distill)."""

import os

# torch's C++ logging prints c10d socket-timeout warnings every second while a draft or TP process starts (the
# leader polls the rendezvous); the app reports real failures itself. Set before torch is first imported.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

__version__ = "0.1.0"
