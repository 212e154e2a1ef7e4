"""Command lines parsed into a value or into ONE error line, for every sub-command.

tyro (train, baseline, eval, evolve, report) and argparse (compare, the pre-parsers) report a bad command line
in their own ways: tyro draws a box of up to 40 lines, argparse prints its usage first. Both are turned here
into :class:`UsageError`, whose message is the ``FLAG: REASON`` that :func:`populora_cli.errors.fail` prints as
``populora CMD: error: FLAG: REASON`` (exit 2), with a hint where one helps: the flag meant by a misspelt one
(difflib over the command's own flags), ``use --no-evolution`` for ``--evolution false``.

tyro's failures are read from its parse-error hook (``tyro._errors.on_parse_error``, tyro >= 1.0: a structured
event per failure). The hook's module is private, so where it is missing or an event of a kind not handled
here arrives, tyro's own message is caught from stderr and its first line of text kept (:func:`_squeeze`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import json
import re
import sys
import typing
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["ArgumentParser", "UsageError", "dataclass_flags", "json_dict_rule", "parse", "reason", "unknown_flag"]

_FALSE = ("false", "no", "off", "0")
_TRUE = ("true", "yes", "on", "1")


class UsageError(Exception):
    """A command line that cannot be parsed; ``str(exc)`` is the one line ``FLAG: REASON``."""


# ------------------------------------------------------------------------------------------ the flags


def dataclass_flags(cls: type, prefix: str = "") -> tuple[list[str], list[str]]:
    """``(flags, switches)`` tyro makes of dataclass ``cls``: every field's ``--dotted.name`` (nested
    dataclasses under their section), and the boolean fields' ``--name`` / ``--no-name`` pairs."""
    flags: list[str] = []
    switches: list[str] = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        while typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        name = f.name.replace("_", "-")
        if dataclasses.is_dataclass(tp):
            sub_flags, sub_switches = dataclass_flags(tp, f"{prefix}{name}.")
            flags += sub_flags
            switches += sub_switches
        elif tp is bool:
            switches += [f"--{prefix}{name}", f"--{prefix}no-{name}"]
        else:
            flags.append(f"--{prefix}{name}")
    return flags, switches


def unknown_flag(token: str, known: Iterable[str]) -> str:
    """The message of an unknown flag: ``--x: unknown flag`` and the closest known one, if any is close."""
    flag = token.split("=", 1)[0]
    close = difflib.get_close_matches(flag, list(known), n=1, cutoff=0.6)
    return f"{flag}: unknown flag" + (f" (did you mean {close[0]}?)" if close else "")


def _switch_pair(flag: str) -> tuple[str, str]:
    """``(--on, --off)`` of a switch given either (``--pbt.no-newborn-protection`` ->
    ``--pbt.newborn-protection``, ``--pbt.no-newborn-protection``)."""
    head, dot, tail = flag[2:].rpartition(".")
    tail = tail.removeprefix("no-")
    return f"--{head}{dot}{tail}", f"--{head}{dot}no-{tail}"


def _stray(token: str, argv: Sequence[str], flags: Sequence[str], switches: Sequence[str]) -> str:
    """The message of a token no flag takes: an unknown flag, or a value after a switch (``--evolution false``)
    or after a flag's own values (``--steps 1 2``)."""
    if token.startswith("-"):
        return unknown_flag(token, [*flags, *switches])
    flag = None
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" in a and a.split("=", 1)[1] == token:
            flag = a.split("=", 1)[0]
            break
        if a == token and i > 0:
            before = [b for b in argv[:i] if b.startswith("-")]
            flag = before[-1].split("=", 1)[0] if before else None
            break
    if flag is not None and flag in switches:
        on, off = _switch_pair(flag)
        use = off if token.lower() in _FALSE else on if token.lower() in _TRUE else f"{on} or {off}"
        return f"{flag}: a switch takes no value (got {token!r}): use {use}"
    if flag is not None and (flag in flags or flag in switches):
        return f"{flag}: unexpected extra value {token!r}"
    return f"unexpected argument {token!r}"


# ------------------------------------------------------------------------------------------ tyro


def _argument_flag(argument: Any) -> str:
    try:
        return str(argument.display_name())
    except Exception:  # noqa: BLE001 - a private tyro type: fall back to a neutral name
        return "argument"


_REASONS = (  # Python's and argparse's wording of a value that is not a number -> the project's
    (re.compile(r"could not convert string to float: (.*)"), r"expected a number, got \1"),
    (re.compile(r"invalid literal for int\(\) with base 10: (.*)"), r"expected an int, got \1"),
    (re.compile(r"invalid int value: (.*)"), r"expected an int, got \1"),
    (re.compile(r"invalid float value: (.*)"), r"expected a number, got \1"),
    (re.compile(r"no type matching \{None\}\|INT could be instantiated from \[(.*)\]"), r"expected an int or None, got \1"),
    (re.compile(r"no type matching \{None\}\|FLOAT could be instantiated from \[(.*)\]"),
     r"expected a number or None, got \1"),
    (re.compile(r"no type matching (.+) could be instantiated from \[(.*)\]"), r"expected \1, got \2"),
)


def reason(message: str) -> str:
    """The first line of a parser's message, in the project's words where it says a value is not a number."""
    first = message.strip().splitlines()[0].rstrip(".") if message.strip() else "cannot be parsed"
    for pattern, words in _REASONS:
        if pattern.fullmatch(first):
            return pattern.sub(words, first)
    return first


def _message(event: Any, argv: Sequence[str], flags: Sequence[str], switches: Sequence[str]) -> str | None:
    """The one line of a tyro parse-error event, or None for a kind not handled here."""
    kind = type(event).__name__
    if kind == "UnrecognizedArgs":
        return _stray(event.tokens[0], argv, flags, switches) if event.tokens else None
    if kind == "InstantiationFailure":
        flag = _argument_flag(event.argument) if event.argument is not None else "argument"
        return f"{flag}: {reason(event.message)}"
    if kind == "InvalidChoice":
        choices = sorted(c for c in event.choices if c != "None")  # an optional positional's None is its absence
        return f"{_argument_flag(event.argument)}: invalid choice {event.value!r} (choose from {', '.join(choices)})"
    if kind == "BadValue":
        flag = _argument_flag(event.argument)
        if event.reason == "too_few_values":
            nargs = getattr(getattr(event.argument, "lowered", None), "nargs", 1)
            return f"{flag}: expected {nargs} values" if isinstance(nargs, int) and nargs > 1 else f"{flag}: expected a value"
        return f"{flag}: takes no value (got {event.offending_value!r})"
    if kind == "MissingArgs":
        if getattr(event, "unrecognized_tokens", None):  # a misspelt flag is the likelier cause: name it first
            return _stray(event.unrecognized_tokens[0], argv, flags, switches)
        names = [_argument_flag(a.arg) for a in event.missing_arguments]
        return f"{', '.join(names)}: required"
    return None


def _squeeze(text: str) -> str:
    """The first line of text inside tyro's error box (box-drawing characters and the title dropped)."""
    lines = [re.sub(r"[│╭╮╰╯─]+", " ", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    line = lines[1] if len(lines) > 1 else (lines[0] if lines else "cannot parse the command line")
    m = re.fullmatch(r"Error parsing (\S+): (.*)", line)
    return f"{m.group(1)}: {reason(m.group(2))}" if m else line


def parse(cls: type, argv: Sequence[str], prog: str, *, extra_flags: Iterable[str] = (), **kwargs: Any) -> Any:
    """``tyro.cli(cls, args=argv, prog=prog, **kwargs)``; a command line it refuses raises :class:`UsageError`
    with one line (``--help`` still prints and exits 0). ``extra_flags``: flags the caller takes out of
    ``argv`` before (``--preset``, ``--dry-run``), offered as suggestions for a misspelt flag."""
    import tyro

    flags, switches = dataclass_flags(cls)
    flags = [*flags, *extra_flags, "--help"]
    argv = list(argv)
    hook_message: list[str] = []

    def hook(event: Any) -> None:
        line = _message(event, argv, flags, switches)
        if line is not None:
            hook_message.append(line)
            raise UsageError(line)

    try:
        from tyro._errors import on_parse_error
    except ImportError:  # a tyro without the hook: its message is read from stderr below
        on_parse_error = None  # type: ignore[assignment]
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), (on_parse_error(hook) if on_parse_error
                                                    else contextlib.nullcontext()):
            value = tyro.cli(cls, args=argv, prog=prog, **kwargs)
    except UsageError:
        raise
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise UsageError(hook_message[0] if hook_message else _squeeze(captured.getvalue())) from None
        raise
    sys.stderr.write(captured.getvalue())  # what tyro said about a successful parse (warnings), if anything
    return value


def json_dict_rule() -> Any:
    """tyro rule: every ``dict`` field is one JSON argument (``--env.reward-kwargs '{"extreme_reward": -0.5}'``)
    instead of one flag per key of its default."""
    from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec, PrimitiveTypeInfo

    registry = ConstructorRegistry()

    def parse_json(args: list[str]) -> dict:
        try:
            value = json.loads(args[0])
        except json.JSONDecodeError as e:
            raise ValueError(f"expected a JSON object, got {args[0]!r} ({e.msg} at character {e.pos})") from None
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {args[0]!r}")
        return value

    @registry.primitive_rule
    def _rule(info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
        if typing.get_origin(info.type) is not dict:
            return None
        return PrimitiveConstructorSpec(nargs=1, metavar="JSON", instance_from_str=parse_json,
                                        is_instance=lambda x: isinstance(x, dict),
                                        str_from_instance=lambda x: [json.dumps(x)])

    return registry


# ------------------------------------------------------------------------------------------ argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors raised as :class:`UsageError` in the ``FLAG: REASON`` form (no usage block); an
    unknown ``--flag`` is reported first (argparse would name a missing required flag before it), and flags are
    never abbreviated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # noqa: D102
        if args is not None and self.add_help:  # the full parser (not a pre-parser): unknown flags first
            known = [o for a in self._actions for o in a.option_strings]
            for token in args:
                if token == "--":
                    break
                if token.startswith("--") and token.split("=", 1)[0] not in known:
                    raise UsageError(unknown_flag(token, known))
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> typing.NoReturn:  # noqa: D102 - argparse's hook
        m = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message)
        if m:
            raise UsageError(f"{m.group(1)}: {reason(m.group(2))}")
        m = re.match(r"the following arguments are required: (.*)", message)
        if m:
            raise UsageError(f"{m.group(1)}: required")
        m = re.match(r"unrecognized arguments: (\S+)", message)
        if m:
            known = [s for a in self._actions for s in a.option_strings]
            raise UsageError(unknown_flag(m.group(1), known) if m.group(1).startswith("-")
                             else f"unexpected argument {m.group(1)!r}")
        raise UsageError(message)
