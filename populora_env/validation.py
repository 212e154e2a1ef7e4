"""Validation of teacher proposals: a proposal becomes a task only if it survives every check here.

A deduction/abduction proposal is valid iff (in this order; the first failure is the rejection reason):

1. the completion has the ``<think>``/``<answer>`` structure and the answer holds a ```` ```python ```` and an
   ```` ```input ```` block (``format``);
2. the program is at most ``max_program_chars`` long and the input at most ``max_input_chars`` (``too_long``);
3. the program parses (``parse_error``) and defines a top-level ``def f`` with at least one parameter
   (``no_f``; auxiliary functions and classes are allowed);
4. it passes the AST safety policy of :mod:`populora_env.safety` (``banned``);
   (a program deeper than ``MAX_AST_DEPTH`` AST levels is ``too_long`` too);
5. the input is a comma-separated list of Python literals (``parse_error`` / ``not_literal``);
6. the (type, program, input) key is new: not in the buffers and not proposed earlier this round
   (``duplicate``; can be switched off);
7. in the sandbox, the first run of ``f(input)`` finishes without any exception (``error`` / ``timeout`` /
   ``memory``) and returns a value whose ``repr`` is at most ``max_output_chars`` long (``output_too_large``:
   rejected, never truncated), built only from builtin literal types and parsed by ``ast.literal_eval`` on the
   host (``not_literal``); then a second, **separate** run (a fresh process, with the heap shifted so that
   address-dependent values change) must succeed too and return the same value (``nondeterministic``).
   A run that trips a sandbox defence makes the proposal invalid (``tamper``, with the defence's class), even
   if the program caught the refusal and returned a value; a run that draws randomness (the global ``random``
   generator, the OS's entropy) makes it ``nondeterministic`` (the determinism contract, ``docs/sandbox.md``
   section 7.3).

An induction proposal (the program is given from the buffers) is valid iff its answer holds at least
``induction_inputs`` distinct literal ```` ```input ```` blocks (``too_few_inputs``; the last
``induction_inputs`` distinct ones are kept, as AZR keeps the last 10), the message is at most
``max_message_chars`` (``too_long``), the key is new (``duplicate``), and every input passes step 7.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from populora_env import defaults
from populora_env.checks import check, check_bool, check_choice, check_int, check_number
from populora_env.literals import (
    NOT_LITERAL_MARKER,
    ArgsError,
    CallArgs,
    literal_value,
    parse_call_args,
    quiet_parse,
    safe_unparse,
    same_value,
    type_signature,
    with_heap_padding,
)
from populora_env.metrics import tree_depth
from populora_env.parsing import (
    ProposalPayload,
    extract_answer,
    parse_induction_proposal,
    parse_program_proposal,
)
from populora_env.safety import check_safety
from populora_env.sandbox import ExecJob, ExecResult
from populora_env.sandbox.api import MAX_TIMEOUT_S
from populora_env.tasks import Task, TaskType


class Reason(StrEnum):
    """Why a proposal was rejected, or why a student's attempt was not counted correct."""

    FORMAT = "format"
    TOO_LONG = "too_long"
    PARSE_ERROR = "parse_error"
    NO_F = "no_f"
    BANNED = "banned"
    NOT_LITERAL = "not_literal"
    DUPLICATE = "duplicate"
    TOO_FEW_INPUTS = "too_few_inputs"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    NONDETERMINISTIC = "nondeterministic"
    OUTPUT_TOO_LARGE = "output_too_large"
    WRONG = "wrong"  # students only: ran fine, value differs
    TAMPER = "tamper"  # a run tripped a sandbox defence (ExecResult.tamper names its class)


def check_response_prefixes(prefix: Any, prefixes: Any) -> None:
    """``response_prefix`` a string, ``response_prefixes`` a mapping of task-type values to strings."""
    check(isinstance(prefix, str), "response_prefix", f"must be a string, got {prefix!r}")
    check(isinstance(prefixes, Mapping) and all(t in {x.value for x in TaskType} and isinstance(v, str)
                                                for t, v in prefixes.items()),
          "response_prefixes", f"must map task types ({', '.join(t.value for t in TaskType)}) to strings, "
          f"got {prefixes!r}")


def check_timeout(timeout_s: Any) -> None:
    """``timeout_s`` ``None`` (the sandbox's own limit) or a number of seconds the sandbox accepts."""
    if timeout_s is not None:
        check_number("timeout_s", timeout_s, low=0.0, high=MAX_TIMEOUT_S, low_open=True)


@dataclass(frozen=True)
class ValidationConfig:
    """Limits of proposal validation (see the module docstring)."""

    max_program_chars: int = defaults.MAX_PROGRAM_CHARS
    max_input_chars: int = defaults.MAX_INPUT_CHARS
    max_message_chars: int = defaults.MAX_MESSAGE_CHARS
    max_output_chars: int = defaults.MAX_OUTPUT_CHARS
    induction_inputs: int = defaults.INDUCTION_INPUTS
    reject_duplicates: bool = defaults.REJECT_DUPLICATES
    require_think: bool = defaults.REQUIRE_THINK
    response_prefix: str = ""
    response_prefixes: Mapping[str, str] = field(default_factory=dict)
    lenient_answer_close: bool = defaults.LENIENT_ANSWER_CLOSE
    timeout_s: float | None = None
    profile: str = defaults.VALIDATION_PROFILE
    """'strict' or 'azr' (:data:`VALIDATION_PROFILES`; the 'azr' rules are at the end of this module)."""

    def validate(self) -> None:
        """Check every limit; raise :class:`~populora_env.checks.ConfigError` naming the first bad one."""
        check_int("max_program_chars", self.max_program_chars, 1)
        check_int("max_input_chars", self.max_input_chars, 1)
        check_int("max_message_chars", self.max_message_chars, 0)
        check_int("max_output_chars", self.max_output_chars, 1)
        check_int("induction_inputs", self.induction_inputs, 2)
        for name in ("reject_duplicates", "require_think", "lenient_answer_close"):
            check_bool(name, getattr(self, name))
        check_response_prefixes(self.response_prefix, self.response_prefixes)
        check_timeout(self.timeout_s)
        check_choice("profile", self.profile, VALIDATION_PROFILES)

    def prefix_for(self, task_type: TaskType) -> str:
        """The response prefix of proposals of ``task_type`` (``response_prefixes`` by task-type value, else
        ``response_prefix``), prepended to the completion before the format check."""
        return self.response_prefixes.get(task_type.value, self.response_prefix)


@dataclass(frozen=True)
class ProposalRequest:
    """One proposer prompt of this round: who answers it, which task it asks for, the id the task will get."""

    agent: str
    index: int
    task_type: TaskType
    task_id: str
    round: int
    source: Task | None = None  # induction: the given program's task


@dataclass(frozen=True)
class ProposalOutcome:
    """Validation result of one teacher completion.

    Attributes:
        format_ok: the tag structure and required blocks were present.
        valid: the proposal became ``task``.
        reason: rejection reason (``None`` when valid).
        detail: short human-readable explanation of the reason.
        signature: type signature ``(args) -> output`` of the first I/O pair (valid tasks).
        tamper: the sandbox defence one of the program's runs tripped (:data:`~populora_env.sandbox.TAMPER_CLASSES`);
            the reason is then ``tamper``.
    """

    request: ProposalRequest
    format_ok: bool
    valid: bool
    reason: Reason | None
    detail: str
    task: Task | None = None
    signature: str | None = None
    tamper: str | None = None


@dataclass(frozen=True)
class ProgramCheck:
    """Static (host-side) check of a program: ``reason`` is ``None`` when it passed."""

    reason: Reason | None
    detail: str
    tree: ast.Module | None = None
    program: str | None = None
    """The program as it enters the task when the check rewrote it ('azr': the single function renamed to
    ``f``); ``None``: unchanged."""


#: Deepest AST a program may have: deeper trees (e.g. ``x+x+…+x`` a thousand times) would overflow the
#: recursion of ``ast.unparse`` / ``ast.literal_eval`` on the host. Real programs are 10–30 levels deep.
MAX_AST_DEPTH = 100


def _parse_bounded(program: str, max_chars: int) -> ast.Module | ProgramCheck:
    """The checks every profile starts with: length, syntax and nesting depth. The parsed module, or the
    rejection."""
    if len(program) > max_chars:
        return ProgramCheck(Reason.TOO_LONG, f"program longer than {max_chars} characters")
    try:
        tree = quiet_parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        return ProgramCheck(Reason.PARSE_ERROR, f"program does not parse: {type(exc).__name__}")
    if tree_depth(tree) > MAX_AST_DEPTH:
        return ProgramCheck(Reason.TOO_LONG, f"program nested deeper than {MAX_AST_DEPTH} AST levels")
    return tree


def check_program(program: str, max_chars: int, *, require_params: bool = True) -> ProgramCheck:
    """Length, syntax, nesting depth, entry function ``f`` and safety policy of ``program`` (no execution)."""
    tree = _parse_bounded(program, max_chars)
    if isinstance(tree, ProgramCheck):
        return tree
    entries = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "f"]
    if not entries:
        return ProgramCheck(Reason.NO_F, "no top-level `def f`")
    if require_params:
        args = entries[-1].args
        if not (args.posonlyargs or args.args or args.vararg):
            return ProgramCheck(Reason.NO_F, "f takes no positional parameter")
    try:
        unsafe = check_safety(tree)
    except RecursionError:
        unsafe = "program too deeply nested"
    if unsafe:
        return ProgramCheck(Reason.BANNED, unsafe)
    return ProgramCheck(None, "", tree)


def canonical_program(tree: ast.Module) -> str:
    """Formatting- and comment-insensitive form of a program (``ast.unparse``), used in dedup keys. Total: a
    huge integer literal (beyond Python's int-to-text limit) is written by :func:`safe_unparse`."""
    return safe_unparse(tree)


def task_key(task_type: TaskType, program: str, inputs: Sequence[str]) -> str:
    """Dedup key of a task: type, canonical program, canonical inputs."""
    try:
        prog = safe_unparse(quiet_parse(program))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        prog = program
    return "\x1f".join([task_type.value, prog, *inputs])


def execution_jobs(program: str, call_args: str, timeout_s: float | None) -> tuple[ExecJob, ExecJob]:
    """The two separate runs of the determinism check for ``f(call_args)`` (the second with the heap shifted).

    Both ask for plain data (``ExecJob(plain=True)``): the sandbox's harness checks, after ``f`` returned, that
    the value is built only from exact builtin types and prints it itself, so the value stored as a task's gold
    output is what ``f`` returned (``docs/sandbox.md`` section 7).
    """
    call = f"f({call_args})"
    first = ExecJob(code=program, call=call, timeout_s=timeout_s, plain=True)
    second = ExecJob(code=with_heap_padding(program), call=call, timeout_s=timeout_s, plain=True)
    return first, second


def failure_reason(result: ExecResult) -> tuple[Reason, str] | None:
    """Map a failed sandbox result to a reason (``None`` if the run succeeded with a value). A run that tripped a
    sandbox defence is ``tamper`` and one that drew randomness ``nondeterministic``, whatever it returned."""
    if result.tamper is not None:
        return Reason.TAMPER, f"the program tripped a sandbox defence ({result.tamper})"
    if result.entropy:
        return Reason.NONDETERMINISTIC, "the program drew randomness (the global random generator or OS entropy)"
    status = result.status
    if status == "ok" and result.value is not None:
        return None
    error = (result.error or "").strip()
    last = error.splitlines()[-1][:200] if error else status
    if status == "timeout":
        return Reason.TIMEOUT, "time limit exceeded"
    if status == "memory_limit" or (status == "error" and "MemoryError" in error):
        return Reason.MEMORY, "memory limit exceeded"
    if status == "output_limit":
        return Reason.OUTPUT_TOO_LARGE, "output over the sandbox's limit"
    if NOT_LITERAL_MARKER in error:
        return Reason.NOT_LITERAL, last.replace(NOT_LITERAL_MARKER + ": ", "value is not plain data: ")
    if status == "ok":
        return Reason.ERROR, "no value returned by the sandbox"
    return Reason.ERROR, last


def interpret_first(result: ExecResult, max_output_chars: int) -> tuple[Reason | None, str, Any]:
    """Verdict of the first run: ``(reason, detail, literal value)``; ``reason`` ``None`` = it may be valid."""
    failed = failure_reason(result)
    if failed is not None:
        return failed[0], failed[1], None
    value = str(result.value)
    if len(value) > max_output_chars:
        return Reason.OUTPUT_TOO_LARGE, f"output repr longer than {max_output_chars} characters", None
    ok, literal = literal_value(value)
    if not ok:
        return Reason.NOT_LITERAL, "output repr is not a Python literal", None
    return None, "", literal


def interpret_second(first: ExecResult, second: ExecResult) -> tuple[Reason, str] | None:
    """Verdict of the second (heap-shifted) run of a first run that succeeded: ``None`` = same value."""
    failed = failure_reason(second)
    if failed is not None and failed[0] in (Reason.TAMPER, Reason.NONDETERMINISTIC):
        return failed
    if failed is not None:
        return Reason.NONDETERMINISTIC, f"the second run failed ({failed[0].value}: {failed[1]})"
    if not same_value(str(first.value), str(second.value)):
        return Reason.NONDETERMINISTIC, "two runs returned different values"
    return None


@dataclass
class _Pending:
    """A proposal that passed the host checks and waits for its sandbox runs."""

    slot: int
    program: str
    inputs: list[str]
    arg_values: list[tuple[Any, ...]]
    message: str
    key: str
    expressions: list[str] | None = None  # 'azr': the raw input expressions, evaluated in the sandbox first
    job_start: int = 0
    second_start: int = 0
    out_value: Any = None


def _input_prefix(item: _Pending, k: int) -> str:
    return f"input {k + 1}: " if len(item.inputs) > 1 else ""


def _run_phases(pending: list[_Pending], sandbox: Any, cfg: ValidationConfig
                ) -> tuple[dict[int, tuple[Reason, str, str | None]], list[ExecResult]]:
    """The sandbox runs of the pending proposals: the first run of every input, then the heap-shifted second run,
    only for proposals whose first runs all succeeded (a failing proposal is invalid either way; this halves the
    cost of timeouts). Each phase is one batched sandbox call. Returns the rejections (``(reason, detail, tamper
    class)`` by index in ``pending``) and the first runs' results."""
    pairs = [execution_jobs(item.program, call_args, cfg.timeout_s) for item in pending for call_args in item.inputs]
    first_results = sandbox.run([p[0] for p in pairs]) if pairs else []
    verdicts: dict[int, tuple[Reason, str, str | None]] = {}
    second_jobs: list[ExecJob] = []
    start = 0
    for n, item in enumerate(pending):
        item.job_start = start
        start += len(item.inputs)
        for k in range(len(item.inputs)):
            first = first_results[item.job_start + k]
            reason, detail, value = interpret_first(first, cfg.max_output_chars)
            if reason is not None:
                verdicts[n] = (reason, _input_prefix(item, k) + detail, first.tamper)
                break
            if k == 0:
                item.out_value = value
        if n not in verdicts:
            item.second_start = len(second_jobs)
            second_jobs.extend(pairs[item.job_start + k][1] for k in range(len(item.inputs)))
    second_results = sandbox.run(second_jobs) if second_jobs else []
    for n, item in enumerate(pending):
        if n in verdicts:
            continue
        for k in range(len(item.inputs)):
            second = second_results[item.second_start + k]
            mismatch = interpret_second(first_results[item.job_start + k], second)
            if mismatch is not None:
                verdicts[n] = (mismatch[0], _input_prefix(item, k) + mismatch[1], second.tamper)
                break
    return verdicts, first_results


class ProposalValidator:
    """Validates a round's proposals with at most two batched sandbox calls (first runs, then second runs)."""

    def __init__(self, config: ValidationConfig) -> None:
        config.validate()
        self.config = config

    def validate(
        self,
        requests: Sequence[ProposalRequest],
        completions: Sequence[object],
        sandbox: Any,
        known_keys: set[str] | frozenset[str] = frozenset(),
    ) -> list[ProposalOutcome]:
        """Validate ``completions[i]`` as the answer to ``requests[i]``.

        Args:
            requests: the proposer prompts of the round.
            completions: aligned completions (anything; non-strings are format errors).
            sandbox: a :class:`populora_env.sandbox.Sandbox` (only used if some proposal reaches step 7).
            known_keys: dedup keys of tasks already in the buffers.
        """
        outcomes: list[ProposalOutcome | None] = [None] * len(requests)
        pending = self._pending(requests, completions, sandbox, known_keys, outcomes)
        verdicts, first_results = _run_phases(pending, sandbox, self.config)
        for n, item in enumerate(pending):
            request = requests[item.slot]
            if n in verdicts:
                reason, detail, tamper = verdicts[n]
                outcomes[item.slot] = ProposalOutcome(request, True, False, reason, detail, tamper=tamper)
                continue
            outputs = [str(first_results[item.job_start + k].value) for k in range(len(item.inputs))]
            task = Task(
                task_id=request.task_id,
                task_type=request.task_type,
                program=item.program,
                inputs=tuple(item.inputs),
                outputs=tuple(outputs),
                message=item.message,
                teacher=request.agent,
                round=request.round,
            )
            signature = type_signature(item.arg_values[0], item.out_value)
            outcomes[item.slot] = ProposalOutcome(request, True, True, None, "", task, signature)
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    def _pending(self, requests: Sequence[ProposalRequest], completions: Sequence[object], sandbox: Any,
                 known_keys: set[str] | frozenset[str], outcomes: list[ProposalOutcome | None]) -> list[_Pending]:
        """The proposals that passed the host checks and are new (duplicates and rejections go to
        ``outcomes``); the 'azr' profile's input expressions are evaluated first (one batched sandbox call)."""
        cfg = self.config
        pending: list[_Pending] = []
        seen: set[str] = set()
        deferred: list[_Pending] = []
        ready: list[tuple[int, ProposalOutcome | _Pending]] = []
        for slot, (request, completion) in enumerate(zip(requests, completions, strict=True)):
            result = self._host_checks(slot, request, completion)
            if isinstance(result, _Pending) and result.expressions is not None:
                deferred.append(result)  # 'azr': the key is known once the inputs are evaluated
            else:
                ready.append((slot, result))
        ready += _evaluate_inputs(deferred, requests, sandbox, cfg)
        for slot, item in ready:
            if isinstance(item, ProposalOutcome):
                outcomes[slot] = item
            elif cfg.reject_duplicates and (item.key in known_keys or item.key in seen):
                outcomes[slot] = ProposalOutcome(requests[slot], True, False, Reason.DUPLICATE, "task already exists")
            else:
                seen.add(item.key)
                pending.append(item)
        return pending

    def _host_checks(self, slot: int, request: ProposalRequest, completion: object) -> ProposalOutcome | _Pending:
        cfg = self.config

        def reject(reason: Reason, detail: str, format_ok: bool = True) -> ProposalOutcome:
            return ProposalOutcome(request, format_ok, False, reason, detail)

        formatted = extract_answer(
            completion, require_think=cfg.require_think, prefix=cfg.prefix_for(request.task_type),
            require_close=not cfg.lenient_answer_close,
        )
        if not formatted.format_ok:
            return reject(Reason.FORMAT, "no <think>…</think><answer>…</answer> structure", False)

        if request.task_type is TaskType.INDUCTION:
            if cfg.profile == "azr":
                return _azr_induction_checks(slot, request, formatted.answer, reject, cfg)
            return self._host_checks_induction(slot, request, formatted.answer, reject)
        if cfg.profile == "azr":
            return _azr_program_checks(slot, request, formatted.answer, reject, cfg)

        payload = _program_payload(formatted.answer, reject, cfg)
        if not isinstance(payload, ProposalPayload):
            return payload
        checked = check_program(payload.program, cfg.max_program_chars)
        if checked.reason is not None:
            return reject(checked.reason, checked.detail)
        try:
            args = parse_call_args(payload.inputs[0])
        except ArgsError as exc:
            return reject(Reason(exc.kind), f"input: {exc.detail}")
        assert checked.tree is not None
        key = "\x1f".join([request.task_type.value, canonical_program(checked.tree), args.canonical])
        return _Pending(slot, payload.program, [args.canonical], [args.values], "", key)

    def _host_checks_induction(self, slot: int, request: ProposalRequest, answer: str, reject: Any) -> Any:
        cfg = self.config
        source = request.source
        assert source is not None, "induction requests carry their program"
        payload = parse_induction_proposal(answer)
        if not payload.inputs:
            return reject(Reason.FORMAT, "answer has no ```input block", False)
        message = payload.message or ""
        if len(message) > cfg.max_message_chars:
            return reject(Reason.TOO_LONG, f"message longer than {cfg.max_message_chars} characters")
        distinct: dict[str, tuple[Any, ...]] = {}
        # keep the last n distinct inputs, as AZR keeps the last 10 (looking at most 8n blocks back)
        for raw in list(reversed(payload.inputs))[: 8 * cfg.induction_inputs]:
            if len(raw) > cfg.max_input_chars:
                return reject(Reason.TOO_LONG, f"input longer than {cfg.max_input_chars} characters")
            try:
                args = parse_call_args(raw)
            except ArgsError as exc:
                return reject(Reason(exc.kind), f"input: {exc.detail}")
            if args.canonical not in distinct:
                distinct[args.canonical] = args.values
            if len(distinct) == cfg.induction_inputs:
                break
        if len(distinct) < cfg.induction_inputs:
            return reject(
                Reason.TOO_FEW_INPUTS, f"{len(distinct)} distinct inputs, {cfg.induction_inputs} required"
            )
        inputs = list(reversed(distinct))
        values = [distinct[i] for i in inputs]
        key = task_key(TaskType.INDUCTION, source.program, inputs)
        return _Pending(slot, source.program, inputs, values, message, key)


# ------------------------------------------------------------------------------------ the 'azr' profile
#
# EnvConfig.validation = "azr": AZR's rules for proposals (docs/azr.md §4, §13.2), with this project's sandbox,
# two-process determinism check and size limits kept:
#
# - the program holds exactly one function definition and no class (AZR rejects any second ``def``); a single
#   function with another name is renamed to ``f`` (its definition and every reference to it);
# - inputs are Python expressions, evaluated in the sandbox (``list(range(5))``, ``'ab' * 3``); each argument's
#   value must be plain literal data and is kept as its ``repr`` (the input the task records and shows);
# - AZR's ban list (:data:`AZR_BANNED_MODULES`: imports, with the dotted entries matched as module-path prefixes
#   where AZR's code compared them with single components and never matched) plus the builtins and names that
#   would reach the sandbox's own guards (:data:`AZR_BANNED_NAMES`, needed so that nothing a program does
#   decides its reward); the rest of the strict policy (``os``, ``sys``, ``id``, ``hash``...) is not applied:
#   the sandbox and the determinism check stand in for it, as they are the boundary in both profiles;
# - induction proposals must carry a message.
# Outputs stay plain literals in both profiles: the host reads values back with ``ast.literal_eval`` only.

VALIDATION_PROFILES = defaults.VALIDATION_PROFILES

#: AZR's banned modules (its code's list; dotted entries are module paths).
AZR_BANNED_MODULES: tuple[str, ...] = (
    "logging", "random", "multiprocessing", "pebble", "subprocess", "threading", "datetime", "time", "hashlib",
    "hmac", "bcrypt", "os.sys", "os.path", "sys.exit", "os.environ", "calendar",
)

#: Builtins that evaluate text or reach the interpreter's namespaces (they would let a program or an input
#: tamper with the sandbox-side guards), and ``input`` (AZR's executor refuses it too).
AZR_BANNED_NAMES: tuple[str, ...] = (
    "eval", "exec", "compile", "__import__", "globals", "locals", "vars", "breakpoint", "input",
)


def _azr_banned_module(path: str) -> str | None:
    parts = path.split(".")
    for entry in AZR_BANNED_MODULES:
        banned = entry.split(".")
        if parts[: len(banned)] == banned:
            return entry
    return None


def check_azr_bans(tree: ast.AST) -> str | None:
    """AZR's ban list on a parsed program or input expression (see the section comment): ``None`` when it
    passes, else a short reason."""
    from populora_env.safety import BANNED_ATTRIBUTES, BANNED_DUNDER_NAMES

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _azr_banned_module(alias.name):
                    return f"import of banned module {alias.name!r}"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return "relative import"
            module = node.module or ""
            if _azr_banned_module(module) or any(_azr_banned_module(f"{module}.{a.name}") for a in node.names):
                return f"import from banned module {module!r}"
        elif isinstance(node, ast.Name):
            if node.id in BANNED_DUNDER_NAMES or node.id.startswith("__populora"):
                return f"use of {node.id!r}"
            if node.id in AZR_BANNED_NAMES and isinstance(node.ctx, ast.Load):
                return f"use of banned builtin {node.id!r}"
        elif isinstance(node, ast.Attribute):
            if node.attr in BANNED_ATTRIBUTES or node.attr.startswith("__populora"):
                return f"use of attribute {node.attr!r}"
        elif isinstance(node, ast.arg) and node.arg.startswith("__populora"):
            return f"parameter {node.arg!r}"
    return None


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str) -> None:
        self.old = old

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name == self.old:
            node.name = "f"
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.old:
            node.id = "f"
        return node


def check_program_azr(program: str, max_chars: int) -> ProgramCheck:
    """AZR's static rules for a proposed program: length, syntax, depth, exactly one function definition
    (nested ones count) and no class, at least one parameter, :func:`check_azr_bans`. A single function not
    named ``f`` is renamed to ``f`` (``ProgramCheck.program`` holds the rewritten program; a program that
    already binds the name ``f`` otherwise is rejected instead, as the rename would change its meaning)."""
    tree = _parse_bounded(program, max_chars)
    if isinstance(tree, ProgramCheck):
        return tree
    defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]
    if any(isinstance(n, ast.ClassDef) for n in ast.walk(tree)):
        return ProgramCheck(Reason.NO_F, "a class definition (the azr profile allows exactly one function)")
    if len(defs) != 1 or not isinstance(defs[0], ast.FunctionDef) or defs[0] not in tree.body:
        return ProgramCheck(Reason.NO_F, f"{len(defs)} function definitions; exactly one top-level def required")
    entry = defs[0]
    if not (entry.args.posonlyargs or entry.args.args or entry.args.vararg):
        return ProgramCheck(Reason.NO_F, "f takes no positional parameter")
    unsafe = check_azr_bans(tree)
    if unsafe:
        return ProgramCheck(Reason.BANNED, unsafe)
    if entry.name == "f":
        return ProgramCheck(None, "", tree)
    if any(isinstance(n, ast.Name) and n.id == "f" for n in ast.walk(tree)):
        return ProgramCheck(Reason.NO_F, f"def {entry.name} cannot be renamed to f: the program uses the name f")
    renamed = ast.fix_missing_locations(_Rename(entry.name).visit(tree))
    try:
        text = ast.unparse(renamed) + "\n"
    except RecursionError:  # unreachable after the depth limit
        return ProgramCheck(Reason.TOO_LONG, "program too deeply nested")
    if len(text) > max_chars:
        return ProgramCheck(Reason.TOO_LONG, f"program longer than {max_chars} characters")
    return ProgramCheck(None, "", quiet_parse(text), text)


def _split_expressions(raw: str) -> list[str] | str:
    """The argument expressions of ``f(<raw>)`` (positional only), or the reason they are not."""
    try:
        call = quiet_parse(f"f({raw.strip()}\n)", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        return f"not an argument list: {type(exc).__name__}"
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        return "not an argument list"
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return "keyword and starred arguments are not accepted"
    unsafe = check_azr_bans(call)
    if unsafe:
        return unsafe
    try:
        return [ast.unparse(a) for a in call.args]
    except RecursionError:
        return "arguments nested too deeply"


def _program_payload(answer: str, reject: Any, cfg: ValidationConfig) -> ProposalPayload | Any:
    """The program and input blocks of a deduction/abduction proposal (both profiles), or the rejection of a
    missing block or an input longer than ``cfg.max_input_chars``."""
    payload = parse_program_proposal(answer)
    if payload.program is None or not payload.inputs:
        missing = "```python" if payload.program is None else "```input"
        return reject(Reason.FORMAT, f"answer has no {missing} block", False)
    if len(payload.inputs[0]) > cfg.max_input_chars:
        return reject(Reason.TOO_LONG, f"input longer than {cfg.max_input_chars} characters")
    return payload


def _azr_program_checks(slot: int, request: ProposalRequest, answer: str, reject: Any,
                        cfg: ValidationConfig) -> ProposalOutcome | _Pending:
    payload = _program_payload(answer, reject, cfg)
    if not isinstance(payload, ProposalPayload):
        return payload
    checked = check_program_azr(payload.program, cfg.max_program_chars)
    if checked.reason is not None:
        return reject(checked.reason, checked.detail)
    exprs = _split_expressions(payload.inputs[0])
    if isinstance(exprs, str):
        return reject(Reason.BANNED if exprs.startswith(("use of", "import")) else Reason.PARSE_ERROR,
                      f"input: {exprs}")
    assert checked.tree is not None
    program = checked.program or payload.program
    return _Pending(slot, program, [], [], "", canonical_program(checked.tree), expressions=[", ".join(exprs)])


def _azr_induction_checks(slot: int, request: ProposalRequest, answer: str, reject: Any,
                          cfg: ValidationConfig) -> ProposalOutcome | _Pending:
    source = request.source
    assert source is not None, "induction requests carry their program"
    payload = parse_induction_proposal(answer)
    if not payload.inputs:
        return reject(Reason.FORMAT, "answer has no ```input block", False)
    message = (payload.message or "").strip()
    if not message:
        return reject(Reason.FORMAT, "no message (the azr profile requires one)", False)
    if len(message) > cfg.max_message_chars:
        return reject(Reason.TOO_LONG, f"message longer than {cfg.max_message_chars} characters")
    raw_inputs: list[str] = []
    for raw in list(reversed(payload.inputs))[: 8 * cfg.induction_inputs]:
        if len(raw) > cfg.max_input_chars:
            return reject(Reason.TOO_LONG, f"input longer than {cfg.max_input_chars} characters")
        exprs = _split_expressions(raw)
        if isinstance(exprs, str):
            return reject(Reason.BANNED if exprs.startswith(("use of", "import")) else Reason.PARSE_ERROR,
                          f"input: {exprs}")
        raw_inputs.append(", ".join(exprs))
    return _Pending(slot, source.program, [], [], payload.message or "", source.program,
                    expressions=list(reversed(raw_inputs)))


def _evaluate_inputs(items: Sequence[_Pending], requests: Sequence[ProposalRequest], sandbox: Any,
                     cfg: ValidationConfig) -> list[tuple[int, ProposalOutcome | _Pending]]:
    """'azr': evaluate every pending proposal's input expressions in the sandbox (one batched call, literal
    inputs need none), keep each input as the ``repr`` of its argument values, then build the dedup key; an
    input whose evaluation fails or whose value is not plain literal data rejects the proposal. Induction keeps
    the last ``induction_inputs`` distinct evaluated inputs (``too_few_inputs`` below that)."""
    jobs: list[ExecJob] = []
    index: list[list[int | CallArgs]] = []
    for item in items:
        row: list[int | CallArgs] = []
        for expr in item.expressions or []:
            try:
                row.append(parse_call_args(expr))  # already literal: nothing to run
            except ArgsError:
                row.append(len(jobs))
                jobs.append(ExecJob(code="", call=f"({expr},)", timeout_s=cfg.timeout_s, plain=True))
        index.append(row)
    results = sandbox.run(jobs) if jobs else []
    out: list[tuple[int, ProposalOutcome | _Pending]] = []
    for item, row in zip(items, index, strict=True):
        request = requests[item.slot]

        def reject(reason: Reason, detail: str, request: ProposalRequest = request) -> ProposalOutcome:
            return ProposalOutcome(request, True, False, reason, detail)

        evaluated: list[CallArgs] = []
        failed: ProposalOutcome | None = None
        for k, entry in enumerate(row):
            if isinstance(entry, CallArgs):
                evaluated.append(entry)
                continue
            reason, detail, value = interpret_first(results[entry], cfg.max_input_chars)
            if reason is not None or not isinstance(value, tuple):
                failed = dataclasses.replace(
                    reject(reason or Reason.NOT_LITERAL, f"input {k + 1}: {detail or 'not an argument tuple'}"),
                    tamper=results[entry].tamper)
                break
            try:
                evaluated.append(parse_call_args(", ".join(repr(v) for v in value)))
            except ArgsError as exc:
                failed = reject(Reason(exc.kind), f"input {k + 1}: {exc.detail}")
                break
        if failed is not None:
            out.append((item.slot, failed))
            continue
        if request.task_type is TaskType.INDUCTION:
            distinct: dict[str, tuple[Any, ...]] = {}
            for args in reversed(evaluated):  # the last n distinct, as AZR keeps the last 10
                distinct.setdefault(args.canonical, args.values)
                if len(distinct) == cfg.induction_inputs:
                    break
            if len(distinct) < cfg.induction_inputs:
                out.append((item.slot, reject(Reason.TOO_FEW_INPUTS,
                                              f"{len(distinct)} distinct inputs, {cfg.induction_inputs} required")))
                continue
            inputs = list(reversed(distinct))
            values = [distinct[i] for i in inputs]
            key = task_key(TaskType.INDUCTION, item.program, inputs)
        else:
            (args,) = evaluated
            inputs, values = [args.canonical], [args.values]
            key = "\x1f".join([request.task_type.value, item.key, args.canonical])
        out.append((item.slot, _Pending(item.slot, item.program, inputs, values, item.message, key)))
    return out


def forbidden_hint(profile: str) -> str:
    """What a proposer prompt lists as forbidden under validation ``profile``: modules (refused in imports) and
    builtins (refused when called, written with ``()`` so that no listed word is part of the required answer
    format, e.g. the ``input`` block)."""
    from populora_env.safety import BANNED_BUILTINS

    if profile == "azr":
        modules, names = AZR_BANNED_MODULES, AZR_BANNED_NAMES
    elif profile == "strict":
        modules = ("os", "sys", "random", "time", "datetime", "subprocess", "socket", "threading", "secrets",
                   "uuid", "pathlib", "io")
        names = tuple(sorted(BANNED_BUILTINS))
    else:
        raise ValueError(f"unknown validation profile {profile!r} (known: {', '.join(VALIDATION_PROFILES)})")
    builtins = ", ".join(f"{n}()" for n in names if not n.startswith("__"))
    return f"the modules {', '.join(modules)}; the builtins {builtins}"
