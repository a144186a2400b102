"""The `ssd-chat` console script: Ctrl+C while the engine's modules import (torch and its compiler take seconds)
exits with code 130 and no traceback, as it does once the CLI runs (ssd_chat.cli.main)."""

from __future__ import annotations

import importlib
import sys


def main() -> None:
    try:
        cli = importlib.import_module("ssd_chat.cli")
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        sys.exit(130)
    cli.main()
