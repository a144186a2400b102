"""The chat app's preferences across runs: the theme, token colours on or off, and what Enter does.

They live in ``preferences.json`` beside the chat history (``$SSD_CHAT_DATA``, or the user data directory), written
when one changes (Ctrl+P's theme, Ctrl+T, /enter). A file that is missing, unreadable or not what it should be
gives the defaults, field by field; one that cannot be written is a warning in the log, never an error: a
preference is not worth a failed chat.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ssd_chat.tui.commands import ENTER_MODES

log = logging.getLogger(__name__)
FILE_NAME = "preferences.json"


@dataclass(frozen=True)
class Preferences:
    theme: str | None = None  # a Textual theme's name; None: the app's default
    colours: bool = False  # token provenance colours (Ctrl+T)
    enter: str = "send"  # ENTER_MODES: what Enter does in the prompt (/enter; --enter wins for a run)

    @classmethod
    def from_dict(cls, data: object) -> Preferences:
        """The fields of `data` that have the right type and value; the defaults for the rest."""
        if not isinstance(data, dict):
            return cls()
        theme, colours, enter = data.get("theme"), data.get("colours"), data.get("enter")
        return cls(theme=theme if isinstance(theme, str) else None,
                   colours=colours if isinstance(colours, bool) else False,
                   enter=enter if enter in ENTER_MODES else "send")


def load(path: Path) -> Preferences:
    try:
        return Preferences.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return Preferences()
    except (OSError, ValueError, RecursionError) as err:  # (JSONDecodeError, UnicodeDecodeError; nested too deep)
        log.warning("preferences ignored: %s: %s", path, err)
        return Preferences()


def save(path: Path, preferences: Preferences) -> bool:
    """Write `preferences` whole (a temporary file of its own renamed over the old one: two app windows writing at
    once leave one's whole file); whether it was written. In the app a failure's warning is a notification."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(json.dumps(asdict(preferences), indent=2) + "\n")
        os.replace(temporary, path)
        return True
    except OSError as err:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        log.warning("preferences not saved: %s: %s", path, err.strerror or err)
        return False


def changed(path: Path, preferences: Preferences, **changes) -> Preferences:
    """`preferences` with `changes`. Only the changed fields go to `path`, over what the file holds now: another app
    window's preferences, saved since this one loaded, stay (the last of two writes at the same moment still wins)."""
    on_disk = load(path)
    if replace(on_disk, **changes) != on_disk:
        save(path, replace(on_disk, **changes))
    return replace(preferences, **changes)
