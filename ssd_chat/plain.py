"""The plain mode, for pipes and scripts (`ssd-chat --plain`, or stdout / stdin not a terminal).

Reads one prompt per line, streams each reply as it arrives on stdout, then a dim stats line on stderr (decode
tok/s, TTFT, tokens, prefix reuse, and tau / acceptance / cache hits in SD and SSD): a pipe gets only the replies.
The whole conversation is resent each turn, so earlier turns come from the prefix cache. `/clear` starts over,
`/continue` writes more of the last reply, `/exit` or end of input quits; any other line that starts with one `/`
is an unknown command (one line on stderr), and `//` sends a literal `/`, as in the chat app. The first Ctrl-C
stops a reply and keeps its partial text, as printed, and its stats line counts only what was printed: its tokens,
tok/s and tau (and drops the lines typed or pasted ahead).
"""

from __future__ import annotations

import array
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from typing import NamedTuple, Protocol, TextIO

from rich.console import Console

from engine.errors import EngineError, PromptTooLongError
from engine.outputs import (
    FEWER_THREADS,
    Event,
    FinishReason,
    RequestFinished,
    RequestOutput,
    TokenDelta,
)
from engine.sampling_params import SamplingParams
from ssd_chat.context_window import context_cut_notice, fit, moved_notice, prompt_refusal
from ssd_chat.engine_failure import EngineFailed, engine_failures
from ssd_chat.history import TurnStats
from ssd_chat.prefill_line import PrefillLine
from ssd_chat.printed_tally import PrintedTally
from ssd_chat.tui.commands import is_slash, split_slash


class PlainEngine(Protocol):
    config: object  # .target
    max_model_len: int

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]: ...

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None, *,
             cancel: threading.Event | None = None, continue_reply: bool = False) -> Iterator[Event]: ...


class PipeConsole(Console):
    """A Console whose write to a reader that went away is a BrokenPipeError, as print's is (cli ends the run with
    128 + SIGPIPE): rich's own handling exits with 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


class Streamed(NamedTuple):
    """What print_stream gives back: the request's output, and the text it wrote and the tokens that text is
    (after a Ctrl-C fewer than the output's: the step under way ran on, unprinted), and what it counted of that
    text (printed_tally.py)."""

    output: RequestOutput
    text: str
    tally: PrintedTally
    stopped: bool  # by `cancel` (a Ctrl-C)

    @property
    def tokens(self) -> int:
        """The tokens of the text written."""
        return self.tally.tokens

    @property
    def stats(self) -> TurnStats:
        """The reply's figures; for one a Ctrl-C stopped, those of the text written (tokens, tok/s, tau)."""
        return self.tally.stats(self.output) if self.stopped else TurnStats.from_output(self.output)


def run_plain(llm: PlainEngine, params: SamplingParams, system: str | None, *, console: Console | None = None) -> None:
    """The read-reply loop until /exit, end of input, or Ctrl-C at the prompt."""
    with suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    console = console or PipeConsole(highlight=False)
    err = PipeConsole(stderr=True, highlight=False)
    interactive = sys.stdin.isatty()
    # Typed at a terminal with stdout a file or pipe (`ssd-chat > replies.txt`): the banner and the prompt go to
    # stderr, where the user looks, and stdout keeps only the replies.
    screen = console if _is_terminal(console.file) else err
    start = [{"role": "system", "content": system}] if system is not None else []
    history = list(start)
    window = 0  # the first turn message the model still sees (ssd_chat.context_window)
    if interactive:
        screen.print(f"{llm.config.target}: /clear resets the conversation, /continue writes more of the last "
                     "reply, /exit or Ctrl-D quits, Ctrl-C stops a reply.", style="dim", markup=False)
    while True:
        try:
            line = _read_line(">>> " if interactive else "", None if screen is console else screen).strip()
        except (EOFError, KeyboardInterrupt):
            if interactive:
                screen.print()
            return
        if is_slash(line):  # the chat app's rule: one / starts a command, // a prompt that begins with /
            command, argument = split_slash(line)
            if command == "clear" and argument:  # ("/clear now" cleared: it has no undo)
                err.print("error: /clear takes no argument: send /clear alone", markup=False)
            elif command in ("exit", "quit"):  # (/quit: /exit's other name)
                return
            elif command == "clear":
                history, window = list(start), 0
                err.print("conversation cleared", style="dim")
            elif command == "continue" and argument:
                err.print("error: /continue takes no argument: send /continue alone", markup=False)
            elif command == "continue" and (len(history) == len(start) or history[-1]["role"] != "assistant"):
                err.print("error: no reply to continue yet", markup=False)
            elif command == "continue":
                window = _reply(llm, history, len(start), window, params, console, err, interactive, continuing=True)
            else:
                err.print(f"error: unknown command /{command}: plain mode knows /clear, /continue and /exit; start "
                          "a line with // to send one that begins with /", markup=False, soft_wrap=True)
            continue
        if not line:
            continue
        line = line[1:] if line.startswith("//") else line
        history.append({"role": "user", "content": line})
        window = _reply(llm, history, len(start), window, params, console, err, interactive)


def _reply(llm: PlainEngine, history: list[dict[str, str]], system: int, window: int, params: SamplingParams,
           console: Console, err: Console, interactive: bool, *, continuing: bool = False) -> int:
    """Stream the reply to `history`'s last prompt (`continuing`: more of its last reply, /continue) and keep it in
    `history`; returns the window the model now sees from. `system`: the system prompt's messages (0 or 1)."""
    start = history[:system]
    try:
        with engine_failures():  # (the reader or the terminal gone, an OSError, passes: main ends it, as SIGPIPE)
            moved = _window(llm, history, window, params, err)
            # The first Ctrl-C asks the engine to stop before its next step; the partial reply is kept, as printed.
            with sigint_flag() as cancel:
                events = llm.chat(start + history[system + moved:], params, cancel=cancel, continue_reply=continuing)
                streamed = print_stream(events, console.file, cancel=cancel)
        output, printed = streamed.output, streamed.text
        if cancel.is_set() and interactive and discard_typed_ahead(sys.stdin.fileno()):
            err.print("(the lines typed or pasted ahead were dropped)", style="dim")
    except EngineError as error:
        why = (prompt_refusal(llm, history, "start again with a shorter --system, or none", str(error))
               if isinstance(error, PromptTooLongError) and not continuing else None)  # (the prompt's size, not the
        if not continuing:  # turns in view; /clear would not help: the window moves)
            history.pop()
        err.print(f"error: {why or error}", markup=False, soft_wrap=True)
        return window
    except EngineFailed as failure:  # a failure inside the engine (a bug, a broken model): one line, the chat kept
        if continuing:
            err.print(f"error: {failure}; the reply stays as it was", markup=False, soft_wrap=True)
            return window
        history.pop()
        err.print(f"error: {failure}; that prompt is not part of the conversation: try again, or /exit",
                  markup=False, soft_wrap=True)
        return window
    if cancel.is_set() and not printed:  # stopped in its prefill: no empty reply for later turns to send
        if not continuing:
            history.pop()
        err.print("(stopped before the reply went on)" if continuing else
                  "(stopped before the reply began: that prompt is not part of the conversation)", style="dim")
        return window
    earlier = len(history) - system - moved > 1  # turns in view before this prompt: /clear gives their room
    text = printed if cancel.is_set() else output.text
    if continuing:
        history[-1]["content"] += text
    else:
        history.append({"role": "assistant", "content": text})
    # (after a Ctrl-C: the tokens, tok/s and tau of the text printed); stdout keeps only the replies
    err.print(streamed.stats.line(), style="dim", markup=False, soft_wrap=True)
    tell_fewer_threads(streamed, err)
    fix = "shorten the prompt" + (", or /clear the earlier turns" if earlier else "")
    tell_context_cut(output, context_cut_notice(llm.max_model_len, fix), err)
    return moved  # (a refused prompt moves no turn out of the model's view)


def tell_context_cut(output: RequestOutput, notice: str, err: Console | None = None) -> None:
    """`notice` as a dim line on stderr (stdout keeps only the reply, for pipes) where the context limit cut the
    reply: it stopped mid-sentence, with nothing else to say why."""
    if output.finish_reason is FinishReason.CONTEXT:
        (err or PipeConsole(stderr=True, highlight=False)).print(f"({notice})", style="dim", markup=False,
                                                                 soft_wrap=True)


def tell_fewer_threads(streamed: Streamed, err: Console | None = None) -> None:
    """A dim line on stderr where the engine stepped the reply on fewer threads for a while (engine.cpu_contention):
    other programs used its cores, and its figures are not a quiet machine's."""
    if streamed.tally.fewer_threads:
        (err or PipeConsole(stderr=True, highlight=False)).print(
            f"({FEWER_THREADS}; --fixed-threads keeps them)", style="dim", markup=False, soft_wrap=True)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # (no isatty, or closed)
        return False


def _read_line(prompt: str, prompt_to: Console | None) -> str:
    """input(prompt); with `prompt_to`, the prompt goes there instead of stdout, where input() writes it."""
    if prompt and prompt_to is not None:
        prompt_to.file.write(prompt)
        prompt_to.file.flush()
        prompt = ""
    return input(prompt)


def _window(llm: PlainEngine, history: list[dict[str, str]], window: int, params: SamplingParams,
            err: Console) -> int:
    """The window's start for this turn (history: the system prompt, if any, then the turns)."""
    moved = fit(llm, history, window, params.max_tokens)
    if moved > window:
        err.print(f"({moved_notice(llm.max_model_len, moved)}; /clear starts over)", style="dim", markup=False,
                  soft_wrap=True)
    return moved


def print_stream(events: Iterator[Event], out: TextIO | None, *, cancel: threading.Event | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> Streamed:
    """Write each delta to `out` as it arrives, then a newline (no wrapping, no markup: the text stays byte-exact
    for pipes; None: write nothing), and return the final output, the text written, its tokens (those of the
    deltas written, and of the textless ones before them: a character or stop string still incomplete) and the
    reply's figures. Once `cancel` is set nothing more is written: the step under way when it was set, and the text
    the engine held back, still arrive, and the figures leave them out (`clock` times the text written:
    printed_tally). A long prompt's prefill shows on a terminal's stderr until the reply starts (prefill_line.py).
    Leaving early (an error, a second Ctrl-C) closes `events`, which cancels the request and frees its KV blocks;
    an exception from inside the engine leaves as EngineFailed (engine_failure.py: one line, not a traceback)."""
    output, progress, written = None, PrefillLine(enabled=None if out is not None else False), []
    tally = PrintedTally(clock)  # what was written (a textless delta's tokens once their text is)
    with engine_failures(), closing(events):  # type: ignore[type-var]  (an exception from inside: EngineFailed)
        try:
            for event in events:
                progress.update(event)
                if isinstance(event, RequestFinished):
                    output = event.output
                elif not (cancel is not None and cancel.is_set()):  # (the tally takes what it counts)
                    tally.add(event)
                    if isinstance(event, TokenDelta) and event.text:
                        written.append(event.text)
                        if out is not None:
                            out.write(event.text)
                            out.flush()
        except BaseException:  # (a second Ctrl-C, SIGTERM, an engine error: the partial reply's line ends)
            if written and out is not None:
                with suppress(OSError, ValueError):  # (its reader gone, or the file closed)
                    out.write("\n")
            raise
        finally:
            progress.clear()
    if out is not None:  # (flushed: a reader gone by now is met here, not by the interpreter's flush at exit)
        out.write("\n")
        out.flush()
    assert output is not None, "a stream ends with RequestFinished"
    return Streamed(output, "".join(written), tally, cancel is not None and cancel.is_set())


def discard_typed_ahead(fd: int) -> int:
    """After Ctrl-C stopped a reply: drop what the terminal holds unread, as a shell does. A pasted text of many
    lines is one prompt per line, and Ctrl-C must stop them all. Returns the bytes dropped (0 where `fd` is no
    terminal)."""
    try:
        import fcntl
        import termios
    except ImportError:  # no termios (Windows)
        return 0
    pending = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, pending)
        termios.tcflush(fd, termios.TCIFLUSH)
    except (OSError, termios.error):  # no terminal: a pipe keeps its lines
        return 0
    return pending[0]


@contextmanager
def sigint_flag() -> Iterator[threading.Event]:
    """Turn the first Ctrl-C into a flag; a second one raises KeyboardInterrupt as usual."""
    flag = threading.Event()

    def on_sigint(signum, frame) -> None:
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
