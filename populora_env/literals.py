"""Host-side handling of Python literals: call arguments, output reprs, value canonicalisation, type signatures.

Nothing here executes model-written text. Only ``ast.parse``, ``ast.literal_eval``, ``ast.unparse`` and string
handling are used on the host; every execution happens in the sandbox. The snippet of sandbox code at the bottom
(:func:`with_heap_padding`) is *our* code that runs before the model's program inside the sandbox.
"""

from __future__ import annotations

import ast
import copy
import warnings
from dataclasses import dataclass
from typing import Any

#: Marker in the error text of a sandbox job whose value had to be plain data and was not
#: (``ExecJob(plain=True)``: the sandbox's harness checks the value's exact types after the call returned).
NOT_LITERAL_MARKER = "POPULORA_NOT_LITERAL"

#: Statement run before the program in the second determinism run: it moves the heap so that
#: address-dependent values (``repr(object())``, ``id()``, default hashes, set order of such objects) differ
#: between the two runs, even when both runs are forked from the same warm worker.
HEAP_PADDING = (
    "__populora_pad__ = [((object(),) * (_i % 17), bytearray(_i * 29), str(_i) * (_i % 7), [None] * (_i % 13))"
    " for _i in range(97)]\n"
)


def quiet_parse(source: str, mode: str = "exec") -> Any:
    """``ast.parse`` with compiler warnings (``SyntaxWarning`` for ``1if``, ``x is 1``, bad escapes...)
    silenced: model text must neither spam the log nor parse differently under ``-W error``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, mode=mode)


class ArgsError(ValueError):
    """Call arguments that are not a comma-separated list of Python literals.

    Attributes:
        kind: ``"parse_error"`` (not an argument list) or ``"not_literal"`` (parses, but an argument is an
            expression rather than a literal).
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True)
class CallArgs:
    """Parsed call arguments.

    Attributes:
        canonical: normalised argument text (``ast.unparse`` of each argument), what goes inside ``f(...)``.
        values: the literal values of positional arguments, then keyword values (for type signatures).
    """

    canonical: str
    values: tuple[Any, ...]


def parse_call_args(text: str) -> CallArgs:
    """Parse ``text`` as the argument list of a call ``f(<text>)`` whose arguments are all Python literals.

    Total: whatever ``text`` is, the only exception is :class:`ArgsError`. An integer argument too large for
    Python's integer-to-text limit (more than ``sys.get_int_max_str_digits()`` decimal digits, e.g. a
    ``0x`` literal of thousands of hex digits) is ``not_literal``: it has no canonical text.

    Raises:
        ArgsError: with ``kind="parse_error"`` or ``kind="not_literal"``.
    """
    try:
        return _parse_call_args(text)
    except ArgsError:
        raise
    except (RecursionError, MemoryError):
        raise ArgsError("parse_error", "arguments nested too deeply") from None
    except ValueError:  # int -> text conversion limit (ast.unparse of a huge integer)
        raise ArgsError("not_literal", "an argument is an integer too large to print") from None
    except Exception as exc:  # noqa: BLE001 - model text must never raise out of here
        raise ArgsError("parse_error", f"not an argument list: {type(exc).__name__}") from None


def _parse_call_args(text: str) -> CallArgs:
    if not isinstance(text, str):
        raise ArgsError("parse_error", "arguments are not a string")
    src = text.strip()
    try:
        tree = quiet_parse(f"f({src}\n)", mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ArgsError("parse_error", f"not an argument list: {type(exc).__name__}") from None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise ArgsError("parse_error", "not an argument list")
    parts: list[str] = []
    values: list[Any] = []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            raise ArgsError("not_literal", "starred arguments are not literals")
        values.append(_literal(arg))
        parts.append(ast.unparse(arg))
    for kw in call.keywords:
        if kw.arg is None:
            raise ArgsError("not_literal", "**kwargs arguments are not literals")
        values.append(_literal(kw.value))
        parts.append(f"{kw.arg}={ast.unparse(kw.value)}")
    return CallArgs(canonical=", ".join(parts), values=tuple(values))


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ArgsError("not_literal", f"argument is not a literal: {_short(safe_unparse(node))}") from None


def safe_unparse(tree: ast.AST) -> str:
    """``ast.unparse(tree)``, total: an integer constant too large for Python's int-to-text limit is written
    as a name ``__int_0x<hex digits>`` (no literal can collide with it), a tree too deep to print gives
    ``ast.dump``-like text of its top or a fixed marker. Used for keys and messages, never for execution."""
    try:
        return ast.unparse(tree)
    except ValueError:
        pass
    except (RecursionError, MemoryError):
        return "<tree too deep to print>"
    try:
        clone = copy.deepcopy(tree)
        for node in ast.walk(clone):
            for name, value in ast.iter_fields(node):
                if isinstance(value, ast.Constant) and type(value.value) is int and _huge(value.value):
                    setattr(node, name, ast.Name(id=f"__int_{hex(value.value).replace('-', 'm')}"))
                elif isinstance(value, list):
                    for i, item in enumerate(value):
                        if isinstance(item, ast.Constant) and type(item.value) is int and _huge(item.value):
                            value[i] = ast.Name(id=f"__int_{hex(item.value).replace('-', 'm')}")
        if isinstance(clone, ast.Constant) and type(clone.value) is int:
            return f"__int_{hex(clone.value).replace('-', 'm')}"
        return ast.unparse(clone)
    except Exception:  # noqa: BLE001 - total by contract
        return "<unprintable tree>"


def _huge(value: int) -> bool:
    try:
        str(value)
    except ValueError:
        return True
    return False


def parse_expression(text: str) -> str | None:
    """The canonical text (``ast.unparse``) of ``text`` as one Python expression, or ``None`` if it is not one
    (or is nested too deeply to handle). Total. An integer too large to print is written as a name
    (:func:`safe_unparse`), so the expression is no literal."""
    if not isinstance(text, str):
        return None
    try:
        tree = quiet_parse(text.strip(), mode="eval")
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError, ...: not one
        return None
    text = safe_unparse(tree.body)  # a huge integer becomes a name: a valid expression, never a literal
    return None if text.startswith("<") and text.endswith(">") else text


def literal_value(text: str) -> tuple[bool, Any]:
    """``(True, value)`` if ``text`` is a Python literal (``ast.literal_eval``), else ``(False, None)``.
    Total: never raises, whatever ``text`` is (non-strings are not literals)."""
    if not isinstance(text, str):
        return False, None
    try:
        return True, ast.literal_eval(quiet_parse(text.strip(), mode="eval"))
    except Exception:  # noqa: BLE001 - ValueError, SyntaxError, RecursionError, MemoryError, ...
        return False, None


def literal_equal(text_a: str, text_b: str) -> bool:
    """Whether two texts are Python literals whose values are equal by ``==`` (Python's value equality:
    ``1 == 1.0``, dict and set order irrelevant). Total (never raises). Both values are built only from
    builtin types by ``ast.literal_eval``, so the comparison runs no model-written code: this is the host's
    answer check."""
    ok_a, val_a = literal_value(text_a)
    ok_b, val_b = literal_value(text_b) if ok_a else (False, None)
    return ok_b and _equal(val_a, val_b)


def _equal(val_a: Any, val_b: Any, key: Any = None) -> bool:
    """``val_a == val_b`` (of ``key(...)`` of each when given), ``False`` when comparing raises (a
    RecursionError on deep values; a ValueError printing a huge int while sorting)."""
    try:
        return bool(val_a == val_b) if key is None else key(val_a) == key(val_b)
    except Exception:  # noqa: BLE001 - total by contract
        return False


#: Characters a claim may have beyond :func:`max_equal_repr_chars` of its expected value (room for a claim
#: printed by other means than the sandbox's harness, e.g. with spaces; a harness-printed one needs none).
CLAIM_SLACK_CHARS = 64


def max_equal_repr_chars(value: Any) -> int:
    """An upper bound on the length of ``repr(v)`` for any plain value ``v == value`` (Python's ``==`` on
    builtin literals: ``1 == 1.0 == True == (1+0j)``, a ``set`` equals a ``frozenset``, dict and set order do
    not count). Linear in the size of ``value``, no recursion.

    Per atom: a string or bytes has one ``repr``; a number may be equal to a number of another type, so the
    bound is the longest of its int, float and complex forms (an integral float such as ``1e+308`` equals an
    int of 309 digits); containers add their brackets and ``", "`` separators (a set may be printed as
    ``frozenset({...})``). Used to refuse a job's claim that is too long to equal an expected value *before*
    parsing it: parsing costs time in proportion to the claim, this bound only to the expected value.
    """
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if item is None or kind is bool:
            total += 6  # True == 1 == 1.0 == (1+0j): '(1+0j)'
        elif kind is int:
            digits = item.bit_length() * 0.30103 + 2  # (no str(): an int may be beyond Python's text limit)
            total += max(int(digits) + 1, 30)  # its float and complex forms: at most 24 + '(' '+0j)'
        elif kind is float:
            total += _float_bound(item)
        elif kind is complex:
            total += _float_bound(item.real) if item.imag == 0 else len(repr(item))
        elif kind is str or kind is bytes:
            total += len(repr(item))
        elif kind in (list, tuple, set, frozenset):
            total += 2 * len(item) + 3 + (11 if kind in (set, frozenset) else 0)  # brackets, ', ', 'frozenset()'
            stack.extend(item)
        elif kind is dict:
            total += 4 * len(item) + 2
            stack.extend(item.keys())
            stack.extend(item.values())
        else:  # not a literal value: nothing is equal to it as a literal
            total += len(repr(item))
    return total


def _float_bound(value: float) -> int:
    text = len(repr(value))
    if value == value and value not in (float("inf"), float("-inf")) and value == int(value):
        text = max(text, int(abs(value)).bit_length() * 31 // 100 + 3)  # the equal int's digits (and sign)
    return text + 6  # '(' and '+0j)' of the equal complex


def literal_matches(claim: str, expected: str) -> bool:
    """Whether a job's ``claim`` (a ``repr`` text) is a literal equal to the ``expected`` literal, as
    :func:`literal_equal`, but refusing before parsing a claim longer than any ``repr`` of a value equal to the
    expected one (:func:`max_equal_repr_chars` + :data:`CLAIM_SLACK_CHARS`): the host's cost is bounded by the
    expected value's size, not by what a job chooses to send. Total (never raises)."""
    ok_e, val_e = literal_value(expected)
    ok_c, val_c = _bounded_value(claim, val_e) if ok_e else (False, None)
    return ok_c and _equal(val_c, val_e)


def _bounded_value(claim: Any, reference: Any) -> tuple[bool, Any]:
    """:func:`literal_value` of ``claim``, or ``(False, None)`` without parsing it when it is longer than any
    ``repr`` of a value equal to ``reference`` (a parsed literal)."""
    if not isinstance(claim, str):
        return False, None
    try:
        if len(claim) > max_equal_repr_chars(reference) + CLAIM_SLACK_CHARS:
            return False, None
    except Exception:  # noqa: BLE001 - total by contract
        return False, None
    return literal_value(claim)


def canonical_form(value: Any) -> Any:
    """A hashable, order-normalised form of a literal value for equality *of runs* (determinism check).

    Lists and tuples keep their order; sets, frozensets and dicts are sorted (their iteration order may depend on
    the worker's hash seed, which is not a property of the program). Types are kept, so ``1`` and ``True``
    differ.
    """
    kind = type(value).__name__
    if isinstance(value, list | tuple):
        return (kind, tuple(canonical_form(v) for v in value))
    if isinstance(value, set | frozenset):
        return (kind, tuple(sorted((canonical_form(v) for v in value), key=repr)))
    if isinstance(value, dict):
        items = ((canonical_form(k), canonical_form(v)) for k, v in value.items())
        return (kind, tuple(sorted(items, key=repr)))
    if isinstance(value, float) and value != value:  # nan: equal to itself for determinism purposes
        return (kind, "nan")
    return (kind, value)


def same_value(repr_a: str, repr_b: str) -> bool:
    """Whether two output reprs denote the same value (identical strings, or equal canonical literal forms).
    ``repr_b`` is refused before it is parsed when it is longer than any repr of a value equal to ``repr_a``
    (:func:`max_equal_repr_chars`): the cost is bounded by the first, the reference. Total: never raises (values
    too deep or with unprintable members compare as different)."""
    if repr_a == repr_b:
        return True
    ok_a, val_a = literal_value(repr_a)
    ok_b, val_b = _bounded_value(repr_b, val_a) if ok_a else (False, None)
    return ok_b and _equal(val_a, val_b, key=canonical_form)


def type_name(value: Any, depth: int = 0) -> str:
    """A short structural type name, e.g. ``list[int]``, ``dict[str, list[int|str]]`` (depth-limited)."""
    kind = type(value).__name__
    if depth >= 2:
        return kind
    if isinstance(value, list | tuple | set | frozenset):
        inner = sorted({type_name(v, depth + 1) for v in value})
        return f"{kind}[{'|'.join(inner)}]"
    if isinstance(value, dict):
        keys = sorted({type_name(k, depth + 1) for k in value})
        vals = sorted({type_name(v, depth + 1) for v in value.values()})
        return f"dict[{'|'.join(keys)}, {'|'.join(vals)}]"
    return kind


def type_signature(arg_values: tuple[Any, ...], output_value: Any) -> str:
    """``"(int, list[int]) -> str"`` for a task's input argument values and output value."""
    args = ", ".join(type_name(v) for v in arg_values)
    return f"({args}) -> {type_name(output_value)}"


def with_heap_padding(program: str) -> str:
    """``program`` with :data:`HEAP_PADDING` inserted before its first statement that is not a docstring or a
    ``from __future__`` import (those must stay first). The program is assumed to parse."""
    try:
        tree = quiet_parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return HEAP_PADDING + program
    insert_after = 0
    for i, stmt in enumerate(tree.body):
        is_docstring = (
            i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        )
        is_future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if is_docstring or is_future:
            insert_after = stmt.end_lineno or 0
        else:
            break
    lines = program.splitlines(keepends=True)
    if insert_after and lines and not lines[insert_after - 1].endswith("\n"):
        lines[insert_after - 1] += "\n"
    return "".join(lines[:insert_after]) + HEAP_PADDING + "".join(lines[insert_after:])


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
