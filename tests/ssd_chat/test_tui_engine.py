"""The engine's failures as the chat app meets them: a crash or a warning mid-reply, a process that dies (while
replying or idle), /restart, and quitting during a step that never ends."""

from __future__ import annotations

import io
import logging
import threading
from types import SimpleNamespace

import pytest

from engine.outputs import ALSO_AN_EVENT
from ssd_chat.tui.chat_actions import ENGINE_STOPPED
from ssd_chat.tui.engine_server import ENGINE_LOGGER, _ToParent
from ssd_chat.tui.log_routing import LogNotice, ToApp
from ssd_chat.tui.screens.loading import EngineLogLine, LoadingScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.transcript import AssistantMessage, UserMessage
from tests.ssd_chat.tui_fakes import FakeEngine, dies_mid_reply, first_delta, make_app, rendered, send, settle, wait_for

SIZE = (120, 40)
REPLY = "Hello from the **fake** engine."


@pytest.mark.asyncio
async def test_quitting_during_a_step_that_never_ends_stops_the_engine_process(tmp_path, monkeypatch):
    """A cancel lands only between steps: when a step runs long, Ctrl+Q waits QUIT_WAIT_S, then kills the
    engine's process (EngineProcess.kill), and the app exits without logging the failure it causes."""
    from ssd_chat.tui import app as app_module

    monkeypatch.setattr(app_module, "QUIT_WAIT_S", 0.05)
    killed = threading.Event()

    class Prefilling(FakeEngine):
        def chat(self, messages, params=None, *, cancel=None, continue_reply=False):
            self.calls.append((messages, params, self.speculation.mode))

            def events():
                assert killed.wait(30), "the engine was not killed"
                raise RuntimeError("the engine process was killed by SIGKILL")
                yield  # a generator

            return events()

        def kill(self) -> None:
            killed.set()

    engine = Prefilling()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.query_one(PromptArea).text = "a very long prompt"
        await pilot.press("enter")
        await wait_for(pilot, lambda: engine.calls, what="the request")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    assert killed.is_set() and engine.closed


@pytest.mark.asyncio
async def test_when_the_engine_process_dies_the_app_says_so_and_sends_nothing(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        dies_mid_reply(engine, after=0)  # (before the reply's first token: the prompt comes back)
        await send(app, pilot, "second")
        assert app.query_one(PromptArea).text == "second"
        assert list(app._notifications)[-1].message == ENGINE_STOPPED
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        calls = len(engine.calls)
        app.query_one("#status").update("stale")  # the refusal below shows the state again
        await send(app, pilot, "third")
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        assert len(engine.calls) == calls and list(app._notifications)[-1].message == ENGINE_STOPPED
        assert [m.content for m in app.session.messages] == ["first", REPLY]

        fresh = FakeEngine()  # /restart: the dead engine is closed, a new one loads, the conversation stays
        app.load_engine = lambda: fresh
        await send(app, pilot, "/restart")  # typed over the refused prompt, which comes back once loaded
        assert engine.closed and app.engine is fresh
        assert app.query_one(PromptArea).text == "third"
        assert "ready" in rendered(app.query_one("#status"))
        assert [m.text for m in app.query(AssistantMessage)] == [REPLY]
        await send(app, pilot, "third")
        assert fresh.calls[0][0][-3:] == [{"role": "user", "content": "first"}, {"role": "assistant", "content": REPLY},
                                          {"role": "user", "content": "third"}]
        assert [m.content for m in app.session.messages] == ["first", REPLY, "third", REPLY]


@pytest.mark.asyncio
async def test_the_prompt_a_dying_engine_was_answering_comes_back_after_restart(tmp_path):
    """The prompt goes back into the input; /restart, typed over it as the notice says, brought back only a prompt
    sent after the death, and this one was lost."""
    engine = dies_mid_reply(FakeEngine(), after=0)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "What is 2+2?")
        assert app.query_one(PromptArea).text == "What is 2+2?" and not app.session.messages
        loaded = threading.Event()
        app.load_engine = lambda: loaded.wait(10) and FakeEngine()
        app.query_one(PromptArea).text = "/restart"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen), what="the loading screen")
        await pilot.press("a", "n", "d")  # typed while it loads: kept, one Ctrl+Z away
        loaded.set()
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        assert app.engine is not engine and area.text == "What is 2+2?"
        assert "Ctrl+Z brings back what you typed while it loaded" in [n.message for n in app._notifications][-1]
        await pilot.press("ctrl+z")
        assert area.text == "and"


@pytest.mark.asyncio
async def test_an_engine_that_dies_while_idle_is_reported_at_once(tmp_path, monkeypatch):
    from ssd_chat.tui import app as app_module

    monkeypatch.setattr(app_module, "WATCH_S", 0.05)
    engine = FakeEngine()
    engine.alive = True
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        assert "ready" in rendered(app.query_one("#status"))
        engine.alive = False  # killed while nothing runs
        await wait_for(pilot, lambda: "engine stopped: /restart" in rendered(app.query_one("#status")),
                       what="the status")
        await pilot.pause(0.2)
        assert [n.message for n in app._notifications].count(ENGINE_STOPPED) == 1  # once, not every check


@pytest.mark.asyncio
async def test_restart_is_refused_while_a_reply_runs_and_works_when_idle(tmp_path):
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        app.query_one(PromptArea).text = "/restart"
        await pilot.press("enter")
        assert "Esc stops it" in list(app._notifications)[-1].message and app.engine is engine
        gate.set()
        await settle(app, pilot)
        await send(app, pilot, "/restart")  # idle, and the engine alive: it restarts all the same
        assert engine.closed and app.engine is engine  # (the fake loader hands back the same fake)
        assert "ready" in rendered(app.query_one("#status"))
        engine.closed = False
        (restart,) = [c for c in app.get_system_commands(app.screen) if c.title == "Restart the engine"]
        restart.callback()  # the palette's entry does the same
        await settle(app, pilot)
        assert engine.closed and "ready" in rendered(app.query_one("#status"))


@pytest.mark.asyncio
async def test_an_engine_crash_before_the_reply_began_keeps_the_conversation_and_gives_the_prompt_back(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        engine.crash_after = 0
        await send(app, pilot, "second")
        assert app.query_one(PromptArea).text == "second"
        assert len(app.query(UserMessage)) == 1 and len(app.query(AssistantMessage)) == 1
        assert any("the engine failed: the draft process was killed" in n.message for n in app._notifications)
        assert app.session.conversation.id is not None  # the first turn is saved
        saved = app.session.store.load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["first", REPLY]


@pytest.mark.asyncio
async def test_an_engine_crash_mid_reply_keeps_what_it_had_written(tmp_path):
    """The streamed text vanished and the prompt went back into the input: what the engine had written is kept,
    as a reply stopped there, in the chat and the history, and F5 (once restarted) writes it again."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        engine.crash_after = 2
        await send(app, pilot, "second")
        assert app.query_one(PromptArea).text == ""
        last = app.query(AssistantMessage).last()
        partial = last.text  # (the tokens of the steps before the crash: 2 or more, as the mode's steps give them)
        n = next(n for n in range(len(engine.words) + 1) if "".join(engine.words[:n]) == partial)
        assert len(app.query(UserMessage)) == 2 and 2 <= n < len(engine.words)
        line = rendered(last.query_one(".reply-stats"))
        assert f" · {n} tokens · " in line and line.endswith(" · stopped: engine failed") and "prefix" not in line
        assert "ctx" not in rendered(app.query_one("#status"))  # (its prompt's size: never told)
        cut = [n.message for n in app._notifications if "the partial reply is kept" in n.message]
        assert len(cut) == 1 and cut[0].startswith("the engine failed: the draft process was killed")
        saved = app.session.store.load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["first", REPLY, "second", partial]
        assert saved.messages[-1].stats.finish_reason == "engine failed"
        assert saved.messages[-1].stats.generated_tokens == n
        engine.crash_after = None
        await pilot.press("f5")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["first", REPLY, "second", REPLY]


@pytest.mark.asyncio
async def test_an_engine_warning_is_a_notification_and_the_reply_goes_on(tmp_path):
    engine = FakeEngine(warning="the draft process died: continuing in AR")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        told = [n.message for n in app._notifications if "continuing in AR" in n.message]
        assert told == ["the draft process died: continuing in AR (/restart starts a new draft process)"]
        assert app.query(AssistantMessage).last().text == REPLY
        mode = app.session.store.load(app.session.conversation.id).settings.mode
        assert mode != "ar" and app.session.settings.mode == "ar"  # the status tells the replies run in AR now
        assert "AR" in rendered(app.query_one("#status"))
        engine.warning = None
        await send(app, pilot, "again")  # saved, the chat keeps its own mode
        assert app.session.store.load(app.session.conversation.id).settings.mode == mode
        app.load_engine = lambda: engine
        next(c for c in app.get_system_commands(app.screen) if c.title == "Restart the engine").callback()
        # a new engine, a new draft process: the chat's own mode back
        await wait_for(pilot, lambda: app.session.settings.mode == mode and not isinstance(app.screen, LoadingScreen),
                       what="the chat's mode after the restart")


def test_an_engine_log_line_a_reply_also_carries_is_not_a_second_notice():
    posted = []
    app = SimpleNamespace(post_message=posted.append)
    for engine in (True, False):
        handler = ToApp(app, logging.INFO, engine=engine)
        for also in (True, False):
            record = logging.LogRecord(ENGINE_LOGGER, logging.WARNING, __file__, 1, "request 1: lost", None, None)
            setattr(record, ALSO_AN_EVENT, also)
            handler.handle(record)  # (as logging calls it: the handler's filters, then emit)
    assert [type(m) for m in posted] == [EngineLogLine, LogNotice]  # only the records no reply carries
    pipe = SimpleNamespace(sent=[], send=lambda item: pipe.sent.append(item))
    for also in (True, False):  # the engine process's handler, which sends the lines to the app
        record = logging.LogRecord(ENGINE_LOGGER, logging.WARNING, __file__, 1, "request 1: lost", None, None)
        setattr(record, ALSO_AN_EVENT, also)
        _ToParent(pipe).handle(record)
    assert pipe.sent == [("log", (logging.WARNING, "request 1: lost"))]


@pytest.mark.asyncio
async def test_a_failed_reply_keeps_what_was_typed_during_it_and_a_palette_restart_keeps_it_too(tmp_path):
    gate = threading.Event()
    engine = dies_mid_reply(FakeEngine(gate=gate, prefill_chunks=1), after=0)  # (dies reading the prompt)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        area.text = "question"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.prefill is not None, what="the prompt's reading")
        area.text = "my next question"  # typed while the reply runs
        gate.set()  # (its notice is a message of its own, handled after the reply ended: wait for it too)
        await wait_for(pilot, lambda: not app.busy and any(n.title == "not sent" for n in app._notifications),
                       what="the failure")
        assert area.text == "question"
        assert "Ctrl+Z brings back what you had typed" in [n.message for n in app._notifications][-1]
        loaded = threading.Event()
        app.load_engine = lambda: loaded.wait(10) and FakeEngine()
        restart = next(c for c in app.get_system_commands(app.screen) if c.title == "Restart the engine")
        restart.callback()  # the palette's: the prompt stays in the input meanwhile
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen), what="the loading screen")
        await pilot.press("backspace", "enter")  # neither edits the prompt that waits to come back
        assert area.text == "question"
        await pilot.press("o", "k")  # typed while it loads: not glued onto the prompt
        loaded.set()
        await settle(app, pilot)
        assert area.text == "question"
        await pilot.press("ctrl+z")
        assert area.text == "ok"


@pytest.mark.asyncio
async def test_a_warning_logged_while_the_app_runs_is_one_line_and_the_handlers_come_back(tmp_path, caplog):
    import logging

    before = logging.getLogger().handlers[:]
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        try:
            raise RuntimeError("deep inside")
        except RuntimeError:
            logging.getLogger("ssd_chat.somewhere").exception("it broke")
        await wait_for(pilot, lambda: any(n.message == "it broke" for n in app._notifications), what="the notice")
        notice = next(n for n in app._notifications if n.message == "it broke")
        assert notice.severity == "error"  # one line: its traceback stays in the log's other handlers
        assert "Traceback" in caplog.text and "deep inside" in caplog.text
    assert logging.getLogger().handlers == before


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.asyncio
async def test_the_terminals_log_handler_is_held_off_while_the_app_runs_and_gets_its_records_after(tmp_path):
    import logging

    terminal = logging.StreamHandler(_Terminal())
    root = logging.getLogger()
    root.addHandler(terminal)
    try:
        app = make_app(FakeEngine(), tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert terminal not in root.handlers
            logging.getLogger("ssd_chat.somewhere").warning("mind the gap")
            await wait_for(pilot, lambda: any(n.message == "mind the gap" for n in app._notifications), what="it")
        assert terminal.stream.getvalue() == ""  # nothing written over the screen, nor while the app let go of it
        app.log_routing.release()  # (run_tui's, once app.run() is back)
        assert terminal in root.handlers and terminal.stream.getvalue() == "mind the gap\n"
    finally:
        root.removeHandler(terminal)


def _serve(monkeypatch, engine_class, sent: list, kwargs: dict) -> list:
    """engine_server.serve in this process, with `engine_class` for engine.LLM and `sent` already in its pipe (no
    watch, no exit at its end; the engine logger's handlers put back): what it answered."""
    import multiprocessing

    import engine
    from ssd_chat.tui import engine_server

    monkeypatch.setattr(engine, "LLM", engine_class)
    monkeypatch.setattr(engine_server, "_watch", lambda parent, closing: None)
    monkeypatch.setattr(engine_server, "_exit_now", lambda: None)
    engine_log = logging.getLogger(ENGINE_LOGGER)
    handlers, propagate, level = list(engine_log.handlers), engine_log.propagate, engine_log.level
    app_end, engine_end = multiprocessing.Pipe()
    try:
        for message in sent:
            app_end.send(message)
        engine_server.serve(engine_end, 4321, "target", kwargs)
        answers = []
        while app_end.poll():
            answers.append(app_end.recv())
        return answers
    finally:
        engine_log.handlers[:], engine_log.propagate = handlers, propagate
        engine_log.setLevel(level)
        app_end.close()
        engine_end.close()


def test_the_engine_process_counts_the_apps_work_as_its_own(monkeypatch):
    """The app imports and draws its first screen for a second after the engine has loaded: the governor's reading
    of the pause before the first reply took that for another program (a quiet machine's first reply on one thread,
    its panel saying the CPU was busy)."""
    from engine.errors import EngineError

    seen = {}

    class Stop:
        def __init__(self, **kwargs) -> None:
            seen.update(kwargs)
            raise EngineError("stopped here")

    assert _serve(monkeypatch, Stop, [], {"threads": 2}) == [("error", "stopped here")]
    assert seen == {"target": "target", "threads": 2, "companion_pids": (4321,)}


def test_the_engine_process_caches_the_chat_templates_opening_for_the_first_reply(tiny_llama_dir):
    """Every reply after the first reused the template's opening from the prefix cache (on SmolLM2 its default
    system prompt: 16 of a first prompt's 40 tokens), the first prefilled it: it is cached while the user types."""
    from engine import LLM, RequestFinished, SamplingParams
    from engine.chat import turn_prefix
    from ssd_chat.tui.engine_server import cache_turn_prefix

    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    system = [{"role": "system", "content": "You are a helpful assistant who answers briefly."}]
    with LLM(str(tiny_llama_dir), max_model_len=256, block_size=4) as llm:
        opening = turn_prefix(llm.tokenizer, [], model=llm.config.target)
        assert llm.tokenizer.decode(opening) == "<|im_start|>user\n"
        assert len(turn_prefix(llm.tokenizer, system, model=llm.config.target)) > len(opening)
        whole = len(opening) // 4 * 4
        assert cache_turn_prefix(llm) == whole > 0
        done = [e for e in llm.chat([{"role": "user", "content": "Hello there"}], greedy)
                if isinstance(e, RequestFinished)]
        assert done[0].output.stats.reused_prefix_tokens == whole
    with LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, enable_prefix_caching=False) as llm:
        assert cache_turn_prefix(llm) == 0


def test_the_engine_process_says_ready_with_a_light_tokenizer_then_caches_and_survives_a_failed_warm_up(monkeypatch):
    """The "ready" payload carries a TokenDecoder (no transformers for the app to import); the template's opening is
    prefilled after it; a failure there is logged, and the process goes on answering (it had ended, silently)."""
    from engine.config import EngineConfig
    from ssd_chat.tui import engine_server
    from tests.conftest import build_tokenizer

    calls = []

    class Loaded:
        def __init__(self, **kwargs) -> None:
            self.config = EngineConfig(target="tiny", block_size=2)
            self.tokenizer, self.max_model_len, self.speculation, self.layout, self.vocab_size = (
                build_tokenizer(), 256, None, {}, 100)

        def stream(self, prompt, params, cancel=None):
            calls.append(("stream", list(prompt)))
            yield from ()
            raise RuntimeError("a kernel failed")

        def encode_chat(self, messages):
            calls.append(("encode",))
            return [1, 2, 3]

        def close(self) -> None:
            calls.append(("close",))

    answers = _serve(monkeypatch, Loaded, [("encode", [{"role": "user", "content": "hi"}]), ("close",)], {})
    (kind, payload), *rest = answers
    assert kind == "ready" and isinstance(payload[4], engine_server.TokenDecoder)
    assert rest == [("ok", [1, 2, 3])]  # still answering after the failed warm-up
    opening = build_tokenizer().encode("<|im_start|>user\n", add_special_tokens=False)
    assert calls == [("stream", opening[:len(opening) // 2 * 2]), ("encode",), ("close",)]


@pytest.mark.asyncio
async def test_an_engine_crash_mid_regeneration_gives_back_the_reply_it_was_to_replace(tmp_path):
    """F5's new reply cut by the engine's death replaced the whole old one with its first tokens."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        engine.crash_after = 2
        await pilot.press("f5")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["first", REPLY]
        assert [m.text for m in app.query(AssistantMessage)] == [REPLY]
        assert app.session.store.load(app.session.conversation.id).messages[-1].content == REPLY
        assert any(n.title == "not sent" for n in app._notifications)


@pytest.mark.asyncio
async def test_an_edit_the_dying_engine_failed_goes_on_after_the_restart(tmp_path):
    """The edit came back into the input, then /restart closed it and gave the edited prompt back as a new one:
    Enter added a turn instead of replacing the edited one."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await pilot.press("f4")
        area = app.query_one(PromptArea)
        area.text = "first, edited"
        dies_mid_reply(engine, after=0)
        await pilot.press("enter")
        await settle(app, pilot)
        assert area.text == "first, edited" and app.current_edit() is not None
        fresh = FakeEngine()
        app.load_engine = lambda: fresh
        await send(app, pilot, "/restart")  # typed over the edited prompt, which comes back once loaded
        assert app.engine is fresh and area.text == "first, edited" and app.current_edit() is not None
        await pilot.press("enter")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["first, edited", REPLY]


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["killed by the quit", "died at the quit"])
async def test_a_quit_keeps_the_partial_reply_of_an_engine_that_died(tmp_path, monkeypatch, how):
    """Ctrl+Q mid-reply keeps what was written, as Esc does, also when the reply ends in the engine's failure: its
    step ran past QUIT_WAIT_S and the quit killed its process, or the process died (out of memory) as the quit
    waited for it: the reply, its prompt too, was lost from the chat and the history."""
    from ssd_chat.history import HistoryStore
    from ssd_chat.tui import app as app_module

    monkeypatch.setattr(app_module, "QUIT_WAIT_S", 0.05)
    killed = threading.Event()

    class Stuck(FakeEngine):
        """Writes "Hello", then its next step never ends until its process is killed (or it died on its own)."""

        def _events(self, *args, **kwargs):
            events = super()._events(*args, **kwargs)
            yield next(events)  # (the first delta)
            cancel = args[-1]
            assert (cancel if how == "died at the quit" else killed).wait(30), "no quit"
            raise RuntimeError("the engine process was killed by SIGKILL")

        def kill(self) -> None:
            killed.set()

    engine = Stuck(gate=threading.Event())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    store = HistoryStore(tmp_path / "history.sqlite3")
    saved = store.load(store.latest().id)
    assert [(m.role, m.content) for m in saved.messages] == [("user", "Hi"), ("assistant", "Hello")]
    assert saved.messages[-1].stats is not None and saved.messages[-1].stats.finish_reason == "engine failed"
