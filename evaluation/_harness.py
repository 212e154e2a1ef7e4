"""Test harness that runs INSIDE the sandbox (evalplus 0.3.1 scoring semantics).

This module is self-contained (standard library only, no project imports): :mod:`evaluation.code`
embeds its source text at the top of every program it sends to the sandbox: *candidate* jobs
(:func:`run_candidate`, :func:`run_calls`: the model's program, no test code, no expected value) and *judge* jobs
(:func:`judge`, :func:`replay_check`: no model-written code; they compare the candidate's claimed values with
the expected ones, rebuilt by :func:`restricted_eval`, which executes nothing). The host imports it only
for the pure helpers that never execute model code (:func:`mbpp_deserialize_inputs`, and
:func:`outputs_match` / :func:`allclose` in unit tests on trusted values).

Semantics follow evalplus 0.3.1 (``evalplus/eval/__init__.py::unsafe_execute``, ``_special_oracle.py``,
``data/mbpp.py::mbpp_deserialize_inputs``; Apache-2.0), re-implemented here:

* expected outputs = the canonical solution's outputs on ``base_input + plus_input`` (MBPP's "not None"
  tasks store ``out is not None``);
* a test passes on exact equality, or, when ``atol`` is non-zero (1e-6 is enforced when the expected output
  is a float or a non-empty list/tuple of floats), on same type + same length + ``allclose(rtol=1e-7, atol)``
  (pure Python here instead of ``numpy.allclose``: same formula ``|a - b| <= atol + rtol * |b|``, NaN never
  close);
* special oracles: HumanEval ``find_zero`` (``|poly(xs, out)| <= atol``; NOTE: evalplus 0.3.1 itself fails
  HumanEval/32 for every solution, its canonical one included, because the oracle's ``continue`` skips the
  progress counter; later evalplus fixed this, and so the oracle here counts a passing test), MBPP
  ``are_equivalent`` (always
  true), ``sum_div`` (or 0), ``surface_Area`` and ``digit_distance_nums`` (alternative readings),
  set-equality tasks, not-None tasks;
* every call gets a deep copy of its input and its own time limit ``max(1 s, 4 x canonical runtime)`` (a
  watchdog thread interrupts it: the sandbox refuses jobs signal handlers; its wall-clock kill backs it up),
  stdout/stderr are swallowed;
* (not in evalplus) the program's top-level code gets its own limit, :data:`LOAD_LIMIT_S`, so a program
  that hangs while being defined fails in seconds rather than at the per-task limit;
* the run stops at the first failing test (evalplus' default ``fast_check``); "base" passes if every
  ``base_input`` test passes, "plus" if every base and plus test passes.
"""

import _thread
import copy
import io
import json
import math
import sys
import time
from collections import Counter, OrderedDict, defaultdict, deque

MBPP_OUTPUT_NOT_NONE_TASKS = ("check_str", "text_match_three", "text_starta_endb")
MBPP_OUTPUT_SET_EQ_TASKS = (
    "similar_elements",  # Mbpp/2
    "find_char_long",  # Mbpp/7
    "common_in_nested_lists",  # Mbpp/111
    "extract_singly",  # Mbpp/140
    "larg_nnum",  # Mbpp/232
    "intersection_array",  # Mbpp/249
    "find_dissimilar",  # Mbpp/579
    "Diff",  # Mbpp/769
)
EVAL_NAMESPACE = {
    "inf": float("inf"),
    "nan": float("nan"),
    "Counter": Counter,
    "OrderedDict": OrderedDict,
    "defaultdict": defaultdict,
    "deque": deque,
}
"""Names a ``repr`` of an expected output may use (``eval`` of these reprs happens only in the sandbox)."""


# --- MBPP+ input types ------------------------------------------------------------------------------------
# MBPP+ stores tuples, sets and complex numbers as JSON lists / strings; task numbers per evalplus 0.3.1,
# including its quirk for Mbpp/115 (an empty member becomes ``{}``, an empty dict).
_ARGS_TO_TUPLES = {
    2,
    116,
    132,
    143,
    222,
    261,
    273,
    394,
    399,
    421,
    424,
    429,
    470,
    560,
    579,
    596,
    616,
    630,
    726,
    740,
    744,
    809,
}
_NESTED_TO_TUPLES = {63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780}
_FIRST_ARG_ITEMS_TO_TUPLES = {75, 413, 444, 753}
_SECOND_ARG_TO_TUPLE = {106, 750}
_FIRST_ARG_TO_TUPLE = {250, 405, 446, 617, 720, 763, 808}
_NESTED_THEN_ARGS_TO_TUPLES = {259, 401, 445}
_EVERYTHING_TO_TUPLES = {580, 615, 791}


def _deep_tuple(value):
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def mbpp_deserialize_inputs(task_id, inputs):
    """Restore the Python types of MBPP+ inputs that JSON cannot hold."""
    n = int(str(task_id).rsplit("/", 1)[-1])
    if n in _ARGS_TO_TUPLES:
        return [[tuple(a) for a in inp] for inp in inputs]
    if n in _NESTED_TO_TUPLES:
        return [[[tuple(x) for x in a] for a in inp] for inp in inputs]
    if n in _FIRST_ARG_ITEMS_TO_TUPLES:
        return [[[tuple(x) for x in inp[0]], inp[1]] for inp in inputs]
    if n in _SECOND_ARG_TO_TUPLE:
        return [[inp[0], tuple(inp[1])] for inp in inputs]
    if n == 115:
        return [[[set(x) if isinstance(x, list) and x else {} for x in inp[0]]] for inp in inputs]
    if n == 124:
        return [(float(inp[0]), complex(inp[1])) for inp in inputs]
    if n in _FIRST_ARG_TO_TUPLE:
        return [[tuple(inp[0]), inp[1]] for inp in inputs]
    if n in _NESTED_THEN_ARGS_TO_TUPLES:
        return [[tuple(tuple(x) for x in a) for a in inp] for inp in inputs]
    if n == 278:
        return [[tuple(tuple(x) if isinstance(x, list) else x for x in inp[0])] for inp in inputs]
    if n == 307:
        return [[tuple(inp[0]), inp[1], inp[2]] for inp in inputs]
    if n == 722:
        return [[{k: tuple(v) for k, v in inp[0].items()}, *inp[1:]] for inp in inputs]
    if n == 252:
        return [[complex(inp[0])] for inp in inputs]
    if n in _EVERYTHING_TO_TUPLES:
        return [_deep_tuple(inp) for inp in inputs]
    return inputs


# --- special oracles --------------------------------------------------------------------------------------


def _poly(xs, x):
    """HumanEval/32 oracle: the polynomial with coefficients ``xs`` at ``x``."""
    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))


def _surface_Area(base_edge, height):  # noqa: N802 - the MBPP entry point's own name
    """Mbpp/581 oracle: ``height`` read as the perpendicular height of the pyramid."""
    slant_height = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant_height) / 2)


def _digit_distance_nums(num1, num2):
    """Mbpp/558 oracle: numbers zero-padded to the same length."""
    a, b = str(num1), str(num2)
    width = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(width), b.zfill(width), strict=True))


def is_floats(x):
    """A float, or a non-empty list/tuple of floats (evalplus: these get atol 1e-6 when atol is 0)."""
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return type(x).__name__ == "ndarray" and str(getattr(x, "dtype", "")) in ("float64", "float32")


def _is_number(x):
    return isinstance(x, (int, float, complex))  # bool is an int, as for numpy


def allclose(out, exp, atol, rtol=1e-7):
    """``numpy.allclose`` for numbers and (nested) lists/tuples of equal shape; anything else: ``False``."""
    if isinstance(exp, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(exp):
            return False
        return all(allclose(o, e, atol, rtol) for o, e in zip(out, exp, strict=True))
    if not (_is_number(out) and _is_number(exp)):
        return False
    if out == exp:  # equal infinities
        return True
    try:
        return abs(out - exp) <= atol + rtol * abs(exp)  # NaN compares False
    except (OverflowError, TypeError):
        return False


def outputs_match(dataset, entry_point, inp, out, exp, atol):
    """Whether ``out`` (candidate) matches ``exp`` (canonical) on input ``inp`` (evalplus rules)."""
    exact = bool(out == exp)
    if dataset == "mbpp":
        if entry_point == "are_equivalent":
            exact = True
        elif entry_point == "sum_div":
            exact = exact or bool(out == 0)
        elif entry_point == "surface_Area":
            exact = exact or abs(out - _surface_Area(*inp)) <= atol
        elif entry_point == "digit_distance_nums":
            exact = exact or bool(out == _digit_distance_nums(*inp))
        elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
            exact = set(out) == set(exp)
        elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
            exact = bool(out == exp) if isinstance(out, bool) else exp == (out is not None)
    if dataset == "humaneval" and entry_point == "find_zero":
        return abs(_poly(*inp, out)) <= atol
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact and atol != 0:
        if type(out) is not type(exp):
            return False
        if isinstance(exp, (list, tuple)) and len(out) != len(exp):
            return False
        return allclose(out, exp, atol)
    return exact


# --- execution --------------------------------------------------------------------------------------------


class _TestTimeout(BaseException):
    """Raised by the interval timer when one test call overruns its limit."""


class _Sink(io.TextIOBase):
    """A write-only stream that drops everything (evalplus' ``swallow_io``)."""

    def write(self, s):
        return len(s)

    def readable(self):
        return False

    def writable(self):
        return True


class _Quiet:
    def __enter__(self):
        self._saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout = sys.stderr = _Sink()
        sys.stdin = io.StringIO("")
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr, sys.stdin = self._saved
        return False


LOAD_LIMIT_S = 4.0
"""Time limit for executing a program's module-level code (its definitions) before the tests."""


def _limited(fn, args, limit_s, start=_thread.start_new_thread, lock=_thread.allocate_lock,
             interrupt=_thread.interrupt_main):
    """``fn(*args)``, interrupted once ``limit_s`` seconds have passed (then :class:`_TestTimeout`).

    A watchdog thread interrupts the main thread (``_thread.interrupt_main``: a ``KeyboardInterrupt`` raised by
    the interpreter's own SIGINT handler), since the sandbox refuses jobs their own signal handlers (a Python
    handler is handed the interrupted frame). The watchdog is gone when this returns; an interrupt that fired
    as ``fn`` returned is absorbed here, never raised later in the harness.
    """
    done, fired = lock(), []
    done.acquire()

    def watchdog():
        if not done.acquire(timeout=limit_s):
            fired.append(True)
            interrupt()
        else:
            done.release()
        finished.release()

    finished = lock()
    finished.acquire()
    start(watchdog, ())
    try:
        with _Quiet():
            return fn(*args)
    except KeyboardInterrupt:
        if fired:
            raise _TestTimeout() from None
        raise
    finally:
        done.release()
        finished.acquire()  # the watchdog has finished
        if fired:
            try:
                for _ in range(100):  # a pending interrupt, not raised yet, is raised (and dropped) here
                    pass
            except KeyboardInterrupt:
                pass


def _load(program, entry_point, limit_s=LOAD_LIMIT_S):
    namespace = {"__name__": "__candidate__"}
    _limited(exec, (compile(program, "<candidate>", "exec"), namespace), limit_s)
    fn = namespace.get(entry_point)
    if not callable(fn):
        raise NameError(f"no function named {entry_point!r}")
    return fn


def _call(fn, inp, limit_s):
    return _limited(fn, copy.deepcopy(inp), limit_s)


def _inputs(inputs_json, task_id, dataset):
    inputs = json.loads(inputs_json)
    return mbpp_deserialize_inputs(task_id, inputs) if dataset == "mbpp" else inputs


def _roundtrips(value, text):
    try:
        return repr(eval(text, dict(EVAL_NAMESPACE))) == text  # noqa: S307 - runs in the sandbox only
    except Exception:
        return False


MAX_REPR_CHARS = 100_000
"""Largest expected-output ``repr`` stored; a task with a larger one is checked in "live" mode."""
MAX_TOTAL_REPR_CHARS = 2_000_000
"""Largest total size of a task's stored expected outputs (beyond it: "live" mode)."""
INT_DIGITS = 50_000
"""``sys.set_int_max_str_digits`` while solutions run (as evalplus' evaluator sets it)."""


def _safe_repr(value):
    """``repr(value)``, or ``None`` when it needs a huge int conversion (slow: quadratic) or fails."""
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(4300)
    try:
        return repr(value)
    except Exception:
        return None
    finally:
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(INT_DIGITS)


def ground_truth(program, entry_point, inputs_json, task_id, dataset, not_none, limit_s, max_total=None):
    """Run the canonical solution on every input.

    Returns JSON ``{"outputs": [repr] | null, "times": [s], "live_reason": str | null}``. ``outputs`` is
    ``null`` ("live" mode: checks recompute expected outputs from the reference in the same job) when some
    output has no ``repr`` that evaluates back to an equal ``repr``, or the reprs are too large to embed in
    every check program (more than ``max_total`` characters, default :data:`MAX_TOTAL_REPR_CHARS`).
    """
    max_total = MAX_TOTAL_REPR_CHARS if max_total is None else max_total
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(INT_DIGITS)
    fn = _load(program, entry_point, 60.0)
    outputs, times, total, live_reason = [], [], 0, None
    for inp in _inputs(inputs_json, task_id, dataset):
        start = time.perf_counter()
        out = _call(fn, inp, limit_s)
        times.append(time.perf_counter() - start)
        if not_none:
            out = out is not None
        if live_reason is not None:
            continue
        text = _safe_repr(out)
        if text is None:
            live_reason = "an output has no usable repr (e.g. a huge int)"
        elif len(text) > MAX_REPR_CHARS or total + len(text) > max_total:
            live_reason = "expected outputs too large to embed"
        elif not _roundtrips(out, text):
            live_reason = "an output's repr does not evaluate back to it"
        else:
            total += len(text)
            outputs.append(text)
    return json.dumps(
        {"outputs": None if live_reason else outputs, "times": times, "live_reason": live_reason}
    )


# --- the candidate and the judge are separate jobs ----------------------------------------------------------
# A candidate program runs alone in its job and returns only what it computed (the ``repr`` of plain data, as
# JSON). It never sees an expected output nor the test code that holds them. A second job, the judge, runs no
# model-written code: it rebuilds the candidate's values with :func:`restricted_eval` (no ``eval``) and
# compares them with the expected ones. Whatever the candidate writes to its reply (a forged "passed" frame
# included) is only a claim of values, which the judge checks.


class NotPlain:
    """Stands for a candidate output that is not plain data (a custom object, a generator...): equal to
    nothing, never None."""

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __repr__(self):
        return "<not plain data>"


class _Unplain(Exception):
    pass


_CTORS = {"Counter": Counter, "OrderedDict": OrderedDict, "deque": deque, "set": set, "frozenset": frozenset}


def plain(value, depth=0):
    """``value`` as plain data: exact builtin types (subclasses of builtins become their base type, numpy
    scalars their ``item()``), ``Counter``/``OrderedDict``/``deque`` kept; raises for anything else."""
    if depth > 200:
        raise _Unplain("too deep")
    kind = type(value)
    if value is None or kind in (bool, int, float, complex, str, bytes):
        return value
    if kind in (Counter, OrderedDict):  # (Counter of an iterable would count it: build from a mapping)
        return kind({plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()})
    if kind is deque:
        return deque(plain(v, depth + 1) for v in value)
    for base in (bool, int, float, complex, str, bytes):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base(plain(v, depth + 1) for v in value)
    if getattr(kind, "__module__", "") == "numpy" and getattr(value, "ndim", None) == 0:
        return plain(value.item(), depth + 1)
    raise _Unplain(kind.__name__)


LONG_REPR_CHARS = 100_000
"""A candidate output whose ``repr`` is longer (or that has none: a huge int) is sent as a digest."""
TOTAL_REPR_CHARS = 8_000_000
"""Most ``repr`` characters a candidate job sends in all; later outputs are sent as digests."""


def _canon(value, depth=0):
    """A text that determines a plain value exactly (ints in hex: no int-to-text limit; sets and dicts
    sorted): what :func:`digest` hashes."""
    if depth > 200:
        raise _Unplain("too deep")
    kind = type(value)
    if kind is int:
        return hex(value)
    if kind in (list, tuple, deque):
        return kind.__name__ + "(" + ",".join(_canon(v, depth + 1) for v in value) + ")"
    if kind in (set, frozenset):
        return kind.__name__ + "(" + ",".join(sorted(_canon(v, depth + 1) for v in value)) + ")"
    if kind in (dict, Counter, OrderedDict):
        items = [_canon(k, depth + 1) + ":" + _canon(v, depth + 1) for k, v in value.items()]
        return kind.__name__ + "(" + ",".join(items if kind is OrderedDict else sorted(items)) + ")"
    return repr(value)


def digest(value):
    """SHA-256 of the exact form of ``value``: ``marshal`` (format 2: no shared-object references, so equal
    values of builtin types give equal bytes; C speed, for outputs of millions of items), else ``repr``, else
    (a huge int in a type marshal refuses) :func:`_canon`. Type-strict (``1`` and ``1.0`` differ), and the
    iteration order of sets and dicts counts: used only for outputs too long to send."""
    import hashlib
    import marshal

    try:
        data = b"m" + marshal.dumps(value, 2)
    except (ValueError, TypeError):
        try:
            text = "r" + repr(value)
        except ValueError:
            text = "c" + _canon(plain(value))
        data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


class Digest:
    """A candidate output sent as its :func:`digest` (too long, or a huge int): equal to a value with the same
    digest. Never None."""

    def __init__(self, hexdigest):
        self.hexdigest = hexdigest

    def __eq__(self, other):
        try:
            return digest(other) == self.hexdigest
        except Exception:  # noqa: BLE001
            return False

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__


def encode_output(value, room=LONG_REPR_CHARS):
    """A candidate output as a JSON-able entry: ``{"r": repr}`` of its plain form when that is at most
    ``min(room, LONG_REPR_CHARS)`` characters, else ``{"h": digest}``; ``{"x": type}`` when not plain data.

    (The entry is the candidate's claim either way: the judge checks it against the expected value, which the
    candidate never saw, so no conversion here needs to be trusted.)"""
    limit = min(room, LONG_REPR_CHARS)
    sized = isinstance(value, (list, tuple, set, frozenset, dict, deque, str, bytes))
    if not (sized and len(value) > limit):  # (a repr is at least as long as the container)
        try:
            small = plain(value)
        except Exception:  # noqa: BLE001
            return {"x": type(value).__name__[:200]}
        try:
            text = repr(small)
            if len(text) <= limit:
                return {"r": text}
        except Exception:  # noqa: BLE001 - a huge int has no repr under the int-to-text limit
            pass
    try:
        return {"h": digest(value)}
    except Exception:  # noqa: BLE001
        return {"x": type(value).__name__[:200]}


def restricted_eval(text):
    """The value of a ``repr`` of plain data, built from its syntax tree without executing anything:
    literals, ``inf``/``nan``, unary minus, complex sums, and calls of ``Counter``, ``OrderedDict``,
    ``deque``, ``set``, ``frozenset`` on such values. Raises ``ValueError`` for anything else."""
    import ast

    tree = ast.parse(text.strip(), mode="eval")
    try:
        return ast.literal_eval(tree)  # the common case, same values
    except ValueError:
        return _build(tree.body, 0)


def _build(node, depth):
    import ast

    if depth > 200:
        raise ValueError("too deep")
    d = depth + 1
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _build(node.operand, d)
        if type(v) not in (int, float, complex):
            raise ValueError("sign of a non-number")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _build(node.left, d), _build(node.right, d)
        if type(left) not in (int, float) or type(right) is not complex:
            raise ValueError("only real +/- imaginary")
        return left + right if isinstance(node.op, ast.Add) else left - right
    if isinstance(node, ast.Tuple):
        return tuple(_build(e, d) for e in node.elts)
    if isinstance(node, ast.List):
        return [_build(e, d) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_build(e, d) for e in node.elts}
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_build(k, d): _build(v, d) for k, v in zip(node.keys, node.values, strict=True)}
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CTORS
            and not node.keywords and len(node.args) <= 1):
        return _CTORS[node.func.id](*[_build(a, d) for a in node.args])
    raise ValueError(f"not plain data: {type(node).__name__}")


def decode_output(entry):
    """The value a candidate claimed (:func:`encode_output`), or a :class:`NotPlain`."""
    if isinstance(entry, dict) and isinstance(entry.get("r"), str):
        try:
            return restricted_eval(entry["r"])
        except Exception:  # noqa: BLE001
            return NotPlain()
    if isinstance(entry, dict) and isinstance(entry.get("h"), str):
        return Digest(entry["h"])
    return NotPlain()


def run_candidate(program, entry_point, inputs_json, task_id, dataset, time_limits, task_limit_s=None):
    """Candidate job (evalplus): the candidate's outputs on every input, stopping at its first exception or
    timeout, or once its calls have taken ``task_limit_s`` in all (the per-task limit: the job's own wall clock
    also covers sending the outputs). Returns JSON ``{"outputs": [entry], "stopped": [i, reason] | null}``; no
    expected value here."""
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(INT_DIGITS)
    inputs = _inputs(inputs_json, task_id, dataset)
    outputs = []
    room = TOTAL_REPR_CHARS
    try:
        fn = _load(program, entry_point)
    except _TestTimeout:
        return json.dumps({"outputs": [], "stopped": [0, "load: timeout while executing the program's top level "
                                                         f"(limit {LOAD_LIMIT_S} s)"]})
    except BaseException as exc:  # noqa: BLE001 - any failure to define the function fails the sample
        return json.dumps({"outputs": [], "stopped": [0, f"load: {type(exc).__name__}: {str(exc)[:200]}"]})
    spent = 0.0
    for i, inp in enumerate(inputs):
        if task_limit_s is not None and spent > task_limit_s:
            return json.dumps({"outputs": outputs, "stopped": [i, f"timeout: the task's limit of {task_limit_s:g} s"]})
        start = time.perf_counter()
        try:
            out = _call(fn, inp, time_limits[i])
        except _TestTimeout:
            return json.dumps({"outputs": outputs, "stopped": [i, f"timeout on test {i} (limit "
                                                                  f"{time_limits[i]:.2f} s)"]})
        except BaseException as exc:  # noqa: BLE001
            return json.dumps({"outputs": outputs, "stopped": [i, f"test {i}: {type(exc).__name__}: "
                                                                  f"{str(exc)[:200]}"]})
        spent += time.perf_counter() - start
        entry = encode_output(out, room)
        room -= len(entry.get("r", ""))
        outputs.append(entry)
    return json.dumps({"outputs": outputs, "stopped": None})


def judge(claimed_json, entry_point, inputs_json, task_id, dataset, expected_reprs, reference, not_none,
          time_limits, atol, n_base):
    """Judge job (evalplus): no model-written code runs here. Compares the candidate's claimed outputs with
    the expected ones (stored reprs, or the reference run here in live mode), stopping at the first failure.
    Returns JSON ``{"base", "plus", "passed", "total", "failed_at",
    "reason"}``."""
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(INT_DIGITS)
    inputs = _inputs(inputs_json, task_id, dataset)
    total = len(inputs)

    def result(passed, reason, failed_at=None):
        return json.dumps({"base": passed >= n_base, "plus": passed == total, "passed": passed, "total": total,
                           "failed_at": failed_at, "reason": reason})

    try:
        claimed = json.loads(claimed_json)
        outputs = claimed["outputs"]
        stopped = claimed.get("stopped")
        if not isinstance(outputs, list):
            raise TypeError("outputs")
    except Exception as exc:  # noqa: BLE001 - the candidate's reply is untrusted text
        return result(0, f"unreadable candidate reply: {type(exc).__name__}", 0)
    ref_fn = _load(reference, entry_point, 60.0) if expected_reprs is None else None
    for i, inp in enumerate(inputs):
        if i >= len(outputs):
            reason = f"test {i}: no output"
            if isinstance(stopped, list) and len(stopped) == 2 and isinstance(stopped[1], str):
                reason = stopped[1][:300]
            return result(i, reason, i)
        if expected_reprs is not None:
            exp = eval(expected_reprs[i], dict(EVAL_NAMESPACE))  # noqa: S307 - the canonical solution's repr
        else:
            exp = _call(ref_fn, inp, max(time_limits[i], 10.0))
            if not_none:
                exp = exp is not None
        out = decode_output(outputs[i])
        try:
            ok = outputs_match(dataset, entry_point, inp, out, exp, atol)
        except BaseException as exc:  # noqa: BLE001
            return result(i, f"test {i}: comparison raised {type(exc).__name__}", i)
        if not ok:
            return result(i, f"test {i}: wrong output", i)
    return result(total, "ok")


# --- HumanEval: the test's check() replays the candidate's recorded answers ---------------------------------


class _Unknown(BaseException):
    """The test called the candidate with arguments whose answer is not recorded yet."""


class CandidateRaised(Exception):
    """The candidate raised on these arguments (in its own job)."""


class _Pending:
    """A not-yet-known candidate answer while calls are being collected: iterates as empty."""

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


def _soft_asserts(test_code):
    """``test_code`` with every ``assert`` made harmless (its test evaluated, failures and errors ignored):
    used only to collect the calls a check will make, never for the verdict."""
    import ast

    class Soften(ast.NodeTransformer):
        def visit_Assert(self, node):  # noqa: N802 - ast API
            handler = ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None, body=[ast.Pass()])
            return ast.Try(body=[ast.Expr(node.test)], handlers=[handler], orelse=[], finalbody=[])

    tree = Soften().visit(ast.parse(test_code))
    return compile(ast.fix_missing_locations(tree), "<test>", "exec")


def _run_test(prompt, code, entry_point, stub):
    import random

    random.seed(0)  # a test drawing random inputs draws the same ones in every round
    namespace = {"__name__": "__candidate__"}
    with _Quiet():
        try:  # the prompt's helpers (e.g. HumanEval/38's encode_cyclic), which the test may call
            exec(compile(prompt, "<prompt>", "exec"), namespace)  # noqa: S102 - the benchmark's text
        except Exception:  # noqa: BLE001 - a prompt that does not run alone: the test may not need it
            pass
        exec(code, namespace)  # noqa: S102 - the benchmark's own test code, no model text
        namespace[entry_point] = stub
        namespace["check"](stub)


def replay_check(prompt, test_code, entry_point, table_json):
    """Judge job (HumanEval): run the problem's ``prompt`` (its helpers) and the benchmark's ``check(candidate)``
    with a stand-in candidate that answers
    from ``table_json`` (``{repr(args): entry}``, the candidate's recorded outputs). No model-written code runs
    here. Returns JSON ``{"verdict": "ok" | "Type: message" | null, "need": [repr(args), ...]}``: a verdict
    once every call the test makes is recorded, else the calls still needed (collected with soft asserts)."""
    import copy as _copy

    table = json.loads(table_json)
    need = []

    def strict(*args):
        key = repr(_copy.deepcopy(args))
        if key not in table:
            raise _Unknown()
        entry = table[key]
        if isinstance(entry, dict) and "e" in entry:
            raise CandidateRaised(str(entry["e"])[:200])
        return decode_output(entry)

    try:
        _run_test(prompt, test_code, entry_point, strict)
        return json.dumps({"verdict": "ok", "need": []})
    except _Unknown:
        pass
    except BaseException as exc:  # noqa: BLE001 - the check failed: the verdict
        text = f"{type(exc).__name__}: {str(exc)[:200]}".rstrip(": ")
        return json.dumps({"verdict": text, "need": []})

    def collect(*args):
        key = repr(_copy.deepcopy(args))
        if key in table:
            return strict(*args)
        if key not in need:
            need.append(key)
        return _Pending()

    try:
        _run_test(prompt, _soft_asserts(test_code), entry_point, collect)
    except BaseException:  # noqa: BLE001 - a statement needed an unknown answer: go on with what we have
        pass
    return json.dumps({"verdict": None, "need": need})


def run_calls(program, entry_point, calls_json, limit_s):
    """Candidate job (HumanEval): the candidate's outputs for the given argument tuples (reprs of plain data),
    in order, within ``limit_s`` in all. Returns JSON ``{repr(args): entry}`` (``{"e": "Type"}`` when it
    raised); no test code and no expected value here."""
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(INT_DIGITS)
    out = {}
    deadline = time.monotonic() + limit_s
    fn = _load(program, entry_point, limit_s)
    for key in json.loads(calls_json):
        try:
            args = restricted_eval(key)
        except Exception:  # noqa: BLE001
            out[key] = {"e": "the test's arguments are not plain data"}
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise _TestTimeout()
        try:
            value = _call(fn, args, left)
        except _TestTimeout:
            raise
        except BaseException as exc:  # noqa: BLE001
            out[key] = {"e": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        out[key] = encode_output(value)
    return json.dumps(out)
