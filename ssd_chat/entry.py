"""The `ssd-chat` console script: Ctrl+C while the engine's modules import (torch and its compiler take seconds)
exits with code 130 and no traceback, as it does once the CLI runs (ssd_chat.cli.main); SIGTERM and SIGHUP as
well (ssd_chat.stop_signals), with 128 + their number."""

from __future__ import annotations

import importlib
import sys

from ssd_chat import stop_signals


def main() -> None:
    stop_signals.install()
    try:
        cli = importlib.import_module("ssd_chat.cli")
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        stop_signals.exiting()
        sys.exit(stop_signals.exit_code(130))
    cli.main()
