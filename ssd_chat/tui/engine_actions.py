"""The engine's life in the chat app: loading it behind the loading screen (and again on /restart), its log lines,
its failures, and watching that its process lives. A mixin of ChatApp."""

from __future__ import annotations

import gc
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from textual import work

from engine.errors import EngineError
from ssd_chat.tui.chat_actions import engine_stopped
from ssd_chat.tui.engine_worker import ChatEngine
from ssd_chat.tui.messages import EngineLoadFailed, EngineReady
from ssd_chat.tui.screens.loading import EngineLogLine, LoadingScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea, PromptInput

if TYPE_CHECKING:
    from ssd_chat.tui.app import ChatApp

    _Base = ChatApp
else:
    _Base = object

log = logging.getLogger(__name__)


class EngineActions(_Base):
    def restart_engine(self) -> None:
        """Close the engine (a dead one too: its process and what it left) and load the models again, behind the
        loading screen; the conversation and the settings stay. A failed load ends the app as a first one does."""
        if self.prompt_to_restore is None:  # (the views are rebuilt once loaded; an edit the dead engine failed
            self.cancel_edit()  # goes on: its prompt comes back into the input, and Enter sends it in the turn's place)
        engine, self.engine = self.engine, None
        gc.unfreeze()  # what the old engine holds (in this process: SSD_CHAT_ENGINE_PROCESS=0) can be collected
        self.push_screen(LoadingScreen(self.target, self.draft))
        self._load(closing=engine)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _load(self, closing: ChatEngine | None = None) -> None:
        try:
            if closing is not None:
                closing.close()
            engine = self.load_engine()
        except (EngineError, OSError) as err:
            self.post_message(EngineLoadFailed(str(err)))
            return
        except Exception as err:  # a bug or a broken install: still one line (its traceback: -v, after the app)
            if not self.quitting:  # else the load was stopped (stop_loading): no failure at all
                log.info("loading the engine failed", exc_info=True)
                self.post_message(EngineLoadFailed(f"loading the engine failed: {err!r}"))
            return
        self.post_message(EngineReady(engine))

    @property
    def loading_screen(self) -> LoadingScreen | None:
        """The loading screen, wherever it is in the stack (the help or the palette may be open over it)."""
        return next((s for s in self.screen_stack if isinstance(s, LoadingScreen)), None)

    def on_engine_log_line(self, message: EngineLogLine) -> None:
        if self.loading_screen is not None:
            self.loading_screen.add_line(message.line)
        elif message.line:
            self.notify(message.line, severity="warning", timeout=6)

    def on_engine_load_failed(self, message: EngineLoadFailed) -> None:
        if self.quitting:
            return  # its process was stopped: the user quit on the loading screen
        self.load_error = message.error
        self.exit(return_code=2)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.engine, self.told_stopped = message.engine, False
        # What is loaded now lives as long as the app: out of the garbage collector's full passes, which hold the GIL
        # for as long as they take to walk it (the reply thread waits for the GIL; so does an engine in this
        # process, SSD_CHAT_ENGINE_PROCESS=0, between its kernels).
        gc.freeze()
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()  # (under a dialog it leaves as that closes: LoadingScreen.on_screen_resume)
        self.session.take_back_fallbacks()  # (a mode a lost draft process forced: a new engine may have it again)
        self.draft_lost = False
        if self.run_settings.top_k >= self.engine.vocab_size:  # a --top-k that filters nothing: off, as it ran; the
            self.run_settings = replace(self.run_settings, top_k=0)  # chat's goes to it, with fit's notice
        self.fit_settings()
        self.fit_mode()
        self.show_conversation()
        self.warm_cache()  # (a resumed chat's turns, the system prompt)
        if self.history_off is not None and not self.told_history_off:
            self.told_history_off = True
            self.notify_history_off()
        if self.prompt_to_restore and self.query_one(PromptInput).bring_back(self.prompt_to_restore):
            self.notify("the prompt the engine did not answer is back in the input (Ctrl+Z brings back what you "
                        "typed while it loaded)", timeout=6)
        self.prompt_to_restore = None
        self.query_one(PromptArea).focus()

    def _close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            self.action_stop()
            engine.close()  # frees KV blocks and ends the engine's helper processes
        if self.session.store is not None:
            self.session.store.close()
            self.session.store = None

    @property
    def vocab_size(self) -> int | None:
        """The loaded model's vocabulary (a top-k must be under it); None while it loads."""
        return None if self.engine is None else self.engine.vocab_size

    @property
    def max_draft(self) -> int | None:
        """The most tokens the loaded engine drafts a round (EngineConfig.max_draft: the CPU's 31); None: no limit
        past k's own, or not loaded yet."""
        return None if self.engine is None else self.engine.config.max_draft

    @property
    def engine_alive(self) -> bool:
        """False once the engine's own process died (killed, out of memory): nothing more can be sent."""
        return self.engine is None or getattr(self.engine, "alive", True)

    def failure_notice(self, error: str) -> str:
        """The notice of a request that failed with `error`; where the engine's process is gone, how it ended and
        what to do (engine_stopped) instead, told here: the watch (_watch_engine) then says it no second time."""
        if self.engine_alive:
            return error
        self.told_stopped = True
        return engine_stopped(self.engine)

    def _watch_engine(self) -> None:
        """Say so when the engine's process dies while idle (killed, out of memory), not only at the next send (a
        reply under way fails and says so itself)."""
        if self.engine is not None and not self.told_stopped and not self.busy and not self.engine_alive:
            self.told_stopped = True
            self.notify(engine_stopped(self.engine), severity="error", timeout=30)
            self.refresh_status()
