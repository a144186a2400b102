"""The command line's usage errors (typer's, from click: a bad option value, an unknown option, a missing argument)
in the project's one line: the option named as typed on the command line, then what it takes or what to do.

A value an option's parser refuses (cli_options.plain, one_of) reads as the errors the commands raise themselves
(`--mode takes ar, sd or ssd; got 'x'`): `--threads takes a number of CPU threads, 1 to 1024; got 0`, where click
wrote `Invalid value for '--threads': takes ...` (in a box, in typer's standalone mode). An unknown option and the
other usage errors point to the command's --help (`--thread is no option of ssd-chat ask (did you mean
--threads?): see ssd-chat ask --help`); a missing argument says what to give (`ask needs a prompt (ssd-chat ask
"your question", or - to read stdin): see ssd-chat ask --help`), and so does an option given no value (`--out
needs a value: see ssd-chat distill --help`). The app's group (OneLineUsageErrors) reports
them all through usage_line, with exit code 2, before typer's own handling sees them: the console script's and a
test's CliRunner alike.

A write to a stdout whose reader went away (`ssd-chat --help | head -1`) ends the command as SIGPIPE ends a filter,
with 128 + SIGPIPE, as a reply's does (stop_signals.reader_gone): click's own handling exited with 1, and so did
rich's in typer's help (OneLineCommand). The commands are registered with cls=OneLineCommand.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from engine.errors import EngineError
from ssd_chat import stop_signals
from ssd_chat.cli_options import report

# the click typer parses with (recent typers' own copy, typer._click; click itself before), for its exceptions
click_errors = importlib.import_module(typer.BadParameter.__module__)
UsageError = click_errors.UsageError
ROOT_ONLY = ("-v", "--verbose")  # the app's own options, given after a command
# what a command's missing argument is, said with an example: {command} is its path (ssd-chat ask)
MISSING = {"prompt": 'a prompt ({command} "your question", or - to read stdin)'}


class _HelpToAGoneReader:
    """typer writes the help with rich, whose broken pipe (its on_broken_pipe) exits with 1: a BrokenPipeError
    instead, as print's is (writing the help exits no other way), which the group ends as SIGPIPE would."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        try:
            super().format_help(ctx, formatter)  # type: ignore[misc]
        except SystemExit as exc:
            raise BrokenPipeError from exc


class _ParserErrorsInContext:
    """click's parser raises an option given no value (`--out` last on the line) with no context, so the error
    could not say which command's --help to see: the context being parsed, given to it."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc]
        except UsageError as err:
            if err.ctx is None:
                err.ctx, err.cmd = ctx, ctx.command
            raise


class OneLineUsageErrors(_ParserErrorsInContext, _HelpToAGoneReader, TyperGroup):
    """The `ssd-chat` group (typer.Typer(cls=...)): a usage error while it or a command parses its arguments, or
    while it picks the command, is one `error:` line and exit code 2, in typer's standalone mode or not."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:  # (the app's own options)
        with _told_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:  # (the command's name, and the command's options as it parses them)
        with _told_in_one_line():
            return super().invoke(ctx)


class OneLineCommand(_ParserErrorsInContext, _HelpToAGoneReader, TyperCommand):
    """A command (app.command(cls=...)) whose help, written to a reader that went away, ends as SIGPIPE would."""


@contextmanager
def _told_in_one_line() -> Iterator[None]:
    try:
        yield
    except click_errors.NoArgsIsHelpError:  # (its message is the whole help)
        raise
    except UsageError as err:
        raise typer.Exit(report(usage_line(err))) from None
    except BrokenPipeError:  # (--help, --version, models' table: click's own handling exits with 1)
        raise typer.Exit(stop_signals.reader_gone()) from None


def usage_line(err: UsageError) -> str:
    """`err` as one line naming the option (no "Invalid value for", no "Error:" box)."""
    command = err.ctx.command_path if err.ctx is not None else "ssd-chat"
    see_help = f"see {command} --help"
    if isinstance(err, click_errors.MissingParameter):  # (before BadParameter: one of them)
        return f"{_missing(err, command)}: {see_help}"
    if isinstance(err, click_errors.BadParameter) and err.param is not None:  # a parser's refusal: "takes ..."
        if isinstance(err.__cause__, EngineError):  # setting_words' own (--mode's), which names the option itself
            return str(err.__cause__)
        return f"{option_name(err.param)} {err.message}"
    if isinstance(err, click_errors.NoSuchOption):
        if err.option_name in ROOT_ONLY:
            root, _, name = command.rpartition(" ")
            return f"{err.option_name} is an option of {root} itself: give it before the command ({root} -v {name} ...)"
        if owners := _commands_with(err):
            return (f"{err.option_name} is an option of {' and '.join(owners)}, not of the chat: give it after the "
                    f"command's name ({owners[0]} ... {err.option_name})")
        closest = err.possibilities[:2]  # (click's, the closest first; a third was a stretch: bench --thread: --raw)
        guess = f" (did you mean {' or '.join(closest)}?)" if closest else ""
        return f"{err.option_name} is no option of {command}{guess}: {see_help}"
    if isinstance(err, click_errors.BadOptionUsage) and "requires an argument" in err.message:
        return f"{err.option_name} needs a value: {see_help}"
    if isinstance(err, click_errors.BadOptionUsage) and "does not take a value" in err.message:  # (--json=x)
        return f"{err.option_name} takes no value: {see_help}"
    return f"{_sentence(err.format_message())}: {see_help}"  # no such command, an extra argument, ...


def _commands_with(err: click_errors.NoSuchOption) -> list[str]:
    """Given to the group itself (the chat), an option unknown there: the group's commands that take it
    (`ssd-chat --json`: ssd-chat ask and ssd-chat bench), else none."""
    group = err.ctx.command if err.ctx is not None else None
    if not isinstance(group, TyperGroup) or err.option_name is None:
        return []
    name = err.option_name.split("=")[0]
    return [f"{err.ctx.command_path} {cmd_name}" for cmd_name, cmd in sorted(group.commands.items())
            if any(name in p.opts or name in p.secondary_opts for p in cmd.params)]


def _missing(err: UsageError, command: str) -> str:
    """`ask needs a prompt (...)`, `distill needs --out`: click said "Missing argument 'prompt'"."""
    name = getattr(err.param, "name", None)
    if err.ctx is None or err.param is None:
        return _sentence(err.format_message())
    what = MISSING[name].format(command=command) if name in MISSING else option_name(err.param)
    return f"{err.ctx.info_name} needs {what}"


def option_name(param: object) -> str:
    """How the error names an option: its long name (--target, not -t); an argument by its metavar (PROMPT)."""
    opts = getattr(param, "opts", None) or []
    long = [o for o in opts if o.startswith("--")]
    if getattr(param, "param_type_name", "") == "option" and (long or opts):
        return (long or opts)[0]
    return param.human_readable_name  # type: ignore[attr-defined]


def _sentence(message: str) -> str:
    """click's message without its full stop (the line goes on after it)."""
    return message.strip().removesuffix(".")
