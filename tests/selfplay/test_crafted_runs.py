"""Crafted run files (issue 48): one property-based fuzz test over every JSON file that ``train --resume``,
``report``, ``eval``, ``compare`` and ``evolve`` read from a run directory. Each file of a finished run is
mutated (a value's type swapped, a Unicode digit such as ``'²'`` where a number or a step key belongs, huge and
deeply nested values, a key removed or added, a key renamed) and handed to the readers of every command that
reads it, called directly as the command calls them (the CLI's own cases follow); the outcome must be one of:

* the file is used (what was crafted is within what the reader accepts, or a side file's damage is a note), or
* the command's one-line error, an exception the command turns into ``populora CMD: error: ...`` (exit 2),
  whose message names the file, or
* for a checkpoint, the documented fallback: resume skips it, naming the damaged file, for the next intact one.

Checkpoint files are re-sealed (their ``MANIFEST.json`` rewritten) after the change, so the content checks, not
the digests, must catch it. The readers, per command (:data:`READERS`)::

    resume   config.json (read_saved_run, validate), lineage.jsonl and tamper_samples.jsonl (truncated at the
             checkpoint), checkpoints/step_N/{MANIFEST.json, loop_state.json, population/population.json,
             env_state.json, pbt_state.json, pipeline_state.json} (find_resumable + check_checkpoint)
    report   config.json, lineage.jsonl, tamper_samples.jsonl, config_history.jsonl, eval/results.json
             (load_run, then the report's numbers and summary.md)
    eval     config.json (_run_config, students, math template), adapters/<m>/adapter_config.json
             (_adapter_dirs), eval/progress.json and eval/generations/<bench>.jsonl (ResultLog.check, load)
    compare  config.json, run_summary.json, eval/results.json (read_run, then the summary and compare.md)
    evolve   adapters/<m>/adapter_config.json (load_adapter_dir, evolve_dirs)
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation.progress import ResultLog, SettingsMismatch
from selfplay.checkpoint import CheckpointError, find_resumable, write_manifest
from selfplay.rundir import RunDir, RunDirError

UNICODE_DIGITS = ["²", "٣", "𝟘", "Ⅻ", "¼", "৪"]
SETTINGS = {"common": {"model": "tiny-random", "seed": 0}, "entries": {"member:student_0": {"adapter": "x"}},
            "benchmarks": {"gsm8k": {"budget": 8, "k": 0}}}


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = st.one_of(
    st.sampled_from(UNICODE_DIGITS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 1e308, -0.0, float("nan"), float("inf")]),
    st.text(max_size=8),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["step", "²", "x", ""]), st.integers(), max_size=2),
    st.sampled_from([_deep(60), _deep(300), "x" * 100_000, {"²": {"²": "²"}}]),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``doc`` (dict keys, list indices)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:20]):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, data: st.DataObject) -> Any:
    """``doc`` with one hostile change at a drawn place: a value replaced, a key removed, added or renamed."""
    doc = json.loads(json.dumps(doc))
    path = data.draw(st.sampled_from(_paths(doc)), label="path")
    kind = data.draw(st.sampled_from(["replace", "remove", "add", "rename"]), label="kind")
    if not path or kind == "replace":
        value = data.draw(HOSTILE, label="value")
        if not path:
            return value
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
        return doc
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict):
        key = path[-1]
        if kind == "remove":
            del parent[key]
        elif kind == "add":
            parent[data.draw(st.sampled_from(UNICODE_DIGITS + ["extra", "step"]), label="new key")] = \
                data.draw(HOSTILE, label="value")
        else:
            parent[data.draw(st.sampled_from(UNICODE_DIGITS), label="renamed")] = parent.pop(key)
    elif kind == "remove":
        del parent[path[-1]]
    else:
        parent.insert(path[-1], data.draw(HOSTILE, label="value"))
    return doc


# ------------------------------------------------------------------------------------------ the readers


class Refused(Exception):
    """The command line's one line (exit 2) for a run it refuses before any work."""


def _resume(run: Path) -> None:
    from populora_cli.main import main
    from selfplay.config_changes import read_saved_run
    from selfplay.resume import check_checkpoint, truncate_lineage, truncate_tamper_samples

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["train", "--resume", str(run), "--dry-run"])  # config.json: read, compared, validated
    if rc != 0:
        assert rc == 2 and "Traceback" not in err.getvalue(), err.getvalue()
        raise Refused(err.getvalue().strip().splitlines()[-1])
    saved = read_saved_run(run)
    cfg = dataclasses.replace(saved.config, resume=run, plugins=())
    chosen = find_resumable(run, check=lambda d: check_checkpoint(d, cfg))
    for damaged in chosen.skipped if chosen else ():  # the fallback names the damaged file
        assert damaged.checkpoint is not None and str(damaged.checkpoint) in str(damaged)
    truncate_lineage(saved.run, chosen.step if chosen else 0)
    truncate_tamper_samples(saved.run, chosen.step if chosen else 0)


def _report(run: Path) -> None:
    from evaluation.report import numerics as nx
    from evaluation.report.loading import load_run
    from evaluation.report.summary import summary_markdown, unique_names

    data = [load_run(run)]
    unique_names(data)
    entries = {r.name: nx.eval_entries(r) for r in data}
    kids = {r.name: nx.children(r) for r in data}
    windows = {r.name: nx.pair_windows(r) for r in data}
    summary_markdown(data, 0.6, entries, kids, windows, [], [])


def _eval(run: Path) -> None:
    from evaluation.runner import _adapter_dirs, _math_template, _run_config, _students

    rd = RunDir(run)
    run_cfg = _run_config(rd)
    _students(run_cfg)
    _math_template("auto", run_cfg)
    _adapter_dirs(rd)
    log_ = ResultLog(run / "eval", SETTINGS)
    log_.check()
    log_.load("gsm8k")


def _compare(run: Path) -> None:
    from evaluation.compare.rundirs import read_run
    from evaluation.compare.summary import summarize
    from evaluation.compare.write import render_markdown

    render_markdown(summarize([read_run(run)], tail=2, reps=5), [])


def _evolve(run: Path) -> None:
    from evolution.adapters_io import evolve_dirs

    parent = run / "adapters" / "student_0"
    out = run.parent / "child"  # beside the run: what the readers read stays as it was
    try:
        evolve_dirs("copy_parent", [parent], out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


ONE_LINE = {  # what each command turns into its one line (exit 2)
    "resume": (Refused, CheckpointError),
    "report": (FileNotFoundError, ValueError, RunDirError),
    "eval": (FileNotFoundError, ValueError, RunDirError, SettingsMismatch),
    "compare": (RunDirError,),
    "evolve": (ValueError, FileNotFoundError),
}
CALL = {"resume": _resume, "report": _report, "eval": _eval, "compare": _compare, "evolve": _evolve}

STEP = "checkpoints/step_4"
READERS = {
    "config.json": ("resume", "report", "eval", "compare"),
    "run_summary.json": ("compare",),
    "lineage.jsonl": ("resume", "report"),
    "tamper_samples.jsonl": ("resume", "report"),
    "config_history.jsonl": ("report",),
    "eval/results.json": ("report", "compare"),
    "eval/progress.json": ("eval",),
    "eval/generations/gsm8k.jsonl": ("eval",),
    "adapters/student_0/adapter_config.json": ("eval", "evolve"),
    f"{STEP}/MANIFEST.json": ("resume",),
    f"{STEP}/loop_state.json": ("resume",),
    f"{STEP}/population/population.json": ("resume",),
    f"{STEP}/env_state.json": ("resume",),
    f"{STEP}/pbt_state.json": ("resume",),
    f"{STEP}/pipeline_state.json": ("resume",),
}


@pytest.fixture(scope="module")
def crafted_base(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shared run with every file of :data:`READERS` present: the side files a tiny run does not
    write (tamper samples, a configuration change, eval results and an interrupted evaluation's progress, an
    asynchronous run's pipeline record) added in the shape the project writes them."""
    run = tmp_path_factory.mktemp("crafted") / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("report", ".lock"))
    (run / "tamper_samples.jsonl").write_text(json.dumps(
        {"step": 1, "member": "student_0", "agent": "student_0", "role": "student", "index": 0,
         "task_type": "deduction", "task_id": "t", "class": "introspection", "text": "x", "truncated": False}) + "\n")
    (run / "config_history.jsonl").write_text(json.dumps(
        {"step": 2, "field": "trainer.lr", "old": 0.001, "new": 0.002}) + "\n")
    (run / "eval").mkdir()
    (run / "eval" / "results.json").write_text(json.dumps(
        {"complete": True, "benchmarks": {"gsm8k": {"population_mean": 0.5, "weakest": {"member": "student_0",
                                                                                      "score": 0.25}}},
         "aggregates": {"math": {"population_mean": 0.5}}}))
    log_ = ResultLog(run / "eval", SETTINGS)
    log_.begin()
    log_.append("gsm8k", [{"entry": "member:student_0", "task_id": "gsm8k/0", "decoding": "greedy", "sample": 0,
                           "passed": False, "answer": "1"}])
    assert len(log_.load("gsm8k")) == 1
    names = json.loads((run / STEP / "population" / "population.json").read_text())["names"]
    (run / STEP / "pipeline_state.json").write_text(json.dumps(
        {"max_staleness": 1, "versions": dict.fromkeys(names, 2), "birth": dict.fromkeys(names, 0), "floor": 3,
         "boundaries": {"4": dict.fromkeys(names, 2)}, "older_versions": {}, "rating_resets": [[4, names[0]]]}))
    write_manifest(run / STEP, 4)
    for name, commands in READERS.items():  # the unmutated run passes every reader
        assert (run / name).is_file(), name
        for command in commands:
            CALL[command](run)
    return run


def _write(path: Path, doc: Any, lines: list[Any] | None, at: int) -> None:
    if lines is None:
        path.write_text(json.dumps(doc, ensure_ascii=False))
    else:
        lines = list(lines)
        lines[at] = doc
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))


def _check(run: Path, name: str) -> None:
    """Every reader of ``name`` on ``run``: it returns, or raises its command's one-line error naming the file."""
    for command in READERS[name]:
        try:
            CALL[command](run)
        except ONE_LINE[command] as exc:
            said = str(exc)
            assert "\n" not in said.strip(), f"{command}: {said}"
            assert Path(name).name in said or str(run) in said, f"{command} on {name}: {type(exc).__name__}: {said}"


RESTORED = ("lineage.jsonl", "tamper_samples.jsonl")
"""What a reader may rewrite (resume truncates the side files) besides the crafted file: put back after each case."""


@contextmanager
def _crafted(crafted_base: Path, name: str, change) -> Iterator[Path]:
    """The run with ``change(doc or lines)`` written to ``name`` (a checkpoint re-sealed), put back afterwards."""
    run = crafted_base
    parts = Path(name).parts
    checkpoint = Path(*parts[:2]) if parts[0] == "checkpoints" else None
    sealed = [str(checkpoint / "MANIFEST.json")] if checkpoint else []
    kept = {n: (run / n).read_bytes() for n in {name, *RESTORED, *sealed}}
    path = run / name
    text = kept[name].decode()
    try:
        if name.endswith(".jsonl"):
            lines = [json.loads(x) for x in text.splitlines()]
            at, doc = change(lines)
            _write(path, doc, lines, at)
        else:
            _write(path, change(json.loads(text)), None, 0)
        if checkpoint is not None and not name.endswith("MANIFEST.json"):  # re-sealed: the content checks must
            write_manifest(run / checkpoint, int(parts[1].rpartition("_")[2]))  # catch what was crafted
        yield run
    finally:
        for n, data in kept.items():
            (run / n).write_bytes(data)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_run_file_crafted_is_used_refused_in_one_line_or_skipped(crafted_base: Path, data: st.DataObject
                                                                       ) -> None:
    name = data.draw(st.sampled_from(sorted(READERS)), label="file")

    def change(doc: Any) -> Any:
        if name.endswith(".jsonl"):
            at = data.draw(st.integers(0, len(doc) - 1), label="line")
            return at, _mutate(doc[at], data)
        return _mutate(doc, data)

    with _crafted(crafted_base, name, change) as run:
        _check(run, name)


def _key(doc: dict, old: str, new: str) -> dict:
    doc["boundaries"] = {new if k == old else k: v for k, v in doc["boundaries"].items()}
    return doc


@pytest.mark.parametrize("name, change", [
    (f"{STEP}/pipeline_state.json", lambda d: _key(d, "4", "²")),  # isdigit() but not int(): ValueError before
    (f"{STEP}/pipeline_state.json", lambda d: {**d, "boundaries": {"4": {m: 7 for m in d["versions"]}}}),
    (f"{STEP}/loop_state.json", lambda d: {**d, "python_rng": "()"}),  # setstate(()) raised IndexError
    (f"{STEP}/loop_state.json", lambda d: {**d, "python_rng": "(3, (), None)"}),
    (f"{STEP}/pbt_state.json", lambda d: {**d, "protected": {"teacher": ["nobody"]}}),
    (f"{STEP}/pbt_state.json", lambda d: {**d, "n_events": "²"}),
    (f"{STEP}/env_state.json", lambda d: {**d, "agents": ["teacher_0"]}),
    (f"{STEP}/env_state.json", lambda d: {**d, "rng": {"bit_generator": "²"}}),
    (f"{STEP}/population/population.json", lambda d: {**d, "rank": 5}),
])
def test_the_issue_s_crafted_checkpoints_fall_back_to_the_newest_intact_one(crafted_base: Path, name: str,
                                                                             change) -> None:
    """Each was refused after the model loaded (or raised out of the command); now the checkpoint check, before
    the model loads, finds it and resume falls back to step 3, naming the file."""
    from selfplay.config_changes import read_saved_run
    from selfplay.resume import check_checkpoint

    with _crafted(crafted_base, name, change) as run:
        cfg = read_saved_run(run).config
        chosen = find_resumable(run, check=lambda d: check_checkpoint(d, cfg))
        assert chosen is not None and chosen.step == 3
        assert [Path(name).name in str(e) for e in chosen.skipped] == [True], [str(e) for e in chosen.skipped]
        _check(run, name)


def test_the_command_line_says_one_line_naming_the_crafted_file(crafted_base: Path, cli) -> None:
    """A few of the cases through the command line, in process, with a model loader that fails if called:
    resume with both checkpoints crafted (nothing intact: exit 2 naming both files, before the model loads), eval
    on a crafted adapter config, report on a run whose config.json is a list (a note, the report is written)."""
    damage = lambda d: _key(d, "4", "²")  # noqa: E731
    with _crafted(crafted_base, f"{STEP}/pipeline_state.json", damage) as run, \
            _crafted(crafted_base, "checkpoints/step_3/loop_state.json", lambda d: {**d, "python_rng": "()"}):
        rc, err = cli("train", "--resume", str(run))
        line = err.strip().splitlines()[-1]  # after a warning per damaged checkpoint
        assert rc == 2 and line.startswith("populora train: error: ") and "Traceback" not in err, err
        assert "step_4/pipeline_state.json" in line and "step_3/loop_state.json" in line, line
    def advantage(d: dict) -> dict:
        d["config"]["trainer"]["advantage"] = "²"
        return d

    with _crafted(crafted_base, "config.json", advantage) as run:  # a value the flag's check refuses
        rc, err = cli("train", "--resume", str(run))
        assert rc == 2 and err.strip().splitlines()[-1] == (
            f"populora train: error: --resume: {run}/config.json: trainer.advantage: unknown advantage estimator "
            "'²' (known: dr_grpo, grpo, reinforce_pp, reinforce_pp_baseline, rloo)"), err
    with _crafted(crafted_base, "adapters/student_0/adapter_config.json", lambda d: {**d, "r": "²"}) as run:
        rc, err = cli("eval", str(run), "--benchmarks", "gsm8k", "--limit", "1")
        assert rc == 2 and err.strip() == (f"populora eval: error: {run}/adapters/student_0/adapter_config.json: r "
                                           "must be a positive int, got '²'"), err
    with _crafted(crafted_base, "config.json", lambda d: [d]) as run:
        out = crafted_base.parent / "report"
        rc, err = cli("report", str(run), "--out", str(out))
        assert rc == 0, err
        assert "could not read config.json" in (out / "summary.md").read_text()
