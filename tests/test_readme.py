"""Every command in README.md is run — by ``.ci/run``, by this file, or by a named test of the default suite.

A README *command* is each line of a ```bash block (backslash continuations joined, ``# comments`` dropped) and
each inline code span of the prose that starts like a command line (``.venv/bin/...``, ``bash ...``,
``python ...``, ``tensorboard ...``, or ``populora ...`` with a flag); ``a && b`` is the commands ``a`` and
``b`` unless ``.ci/run`` runs the whole line. Each one must be

(a) in ``.ci/run``, as the same text (the README's test command, the installer);
(b) a ``--help`` command, run here exactly as written; or
(c) in :data:`COVERED`, the reviewed mapping command -> the tests of the default suite that run it (each must
    exist and not be marked ``slow`` or ``e2e``), with why. A mapped ``populora`` command is also checked here with the
    README's exact flags: ``train`` / ``baseline`` resolve them with ``--dry-run`` (in a folder holding the
    files the README writes, e.g. ``my_scheme.py``), the other sub-commands must list every flag in their
    ``--help``; so a renamed flag or preset fails here even where the mapped test uses its own arguments.

A README command in none of these fails :func:`test_every_readme_command_is_run`; a mapping entry whose
command left the README fails too (the mapping is kept reviewed, not accumulated).

Commands that need what the suite does not have (the 5-7 minute SmolLM2 main job, a GPU, a Ray cluster) are
mapped to the tests that run the same code path on ``tiny-random`` or a one-machine cluster, and say so.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"

MAX_LINES = 230  # 220 + the bridges' section (issue 47)
AFTER_MAIN_JOB = "tests/selfplay/test_readme_results.py::test_the_commands_after_the_main_job_run_verbatim"

COMMAND_START = re.compile(r"(\.venv(-vllm)?/bin/|bash |python |pytest |tensorboard |ray )|populora \S+.* --")


@dataclass(frozen=True)
class Cover:
    tests: tuple[str, ...]
    """Node ids (``path::function``) of default-suite tests that run this command or its code path."""
    why: str


COVERED: dict[str, Cover] = {
    ".venv/bin/populora train": Cover(
        ("tests/selfplay/test_train_smoke.py::test_train_smoke_writes_everything",
         "tests/selfplay/test_presets.py::test_dry_run_prints_the_preset",
         "tests/sandbox/test_reward_hacking.py::test_hacks_earn_nothing_in_a_populora_train_run"),
        "the main job (preset cpu-smoke, SmolLM2-135M, 9 steps, 5-7 min) is too long for the suite: its "
        "configuration is resolved here and by the preset dry-run test, the same command runs end to end on "
        "tiny-random (smoke test), and with the cpu-smoke preset file itself on tiny-random (reward hacking)"),
    ".venv/bin/populora train --resume runs/cpu-smoke-population-s0": Cover(
        ("tests/selfplay/test_resume.py::test_kill_9_during_checkpoint_writes_then_resume_equals_uninterrupted"
         "[mid_population+pruning]",
         "tests/selfplay/test_plugins.py::test_resume_imports_the_plugin_again"),
        "--resume RUN_DIR on a tiny-random run killed by kill -9, and on the README plugin example's run"),
    ".venv/bin/populora baseline": Cover(
        ("tests/selfplay/test_train_smoke.py::test_baseline_smoke_one_adapter",
         "tests/selfplay/test_cli_config.py::test_baseline_dry_run_is_the_transformed_config"),
        "the baseline on tiny-random end to end, and the cpu-smoke baseline's resolved configuration"),
    ".venv/bin/tensorboard --logdir runs/": Cover(
        ("tests/selfplay/test_logging_contract.py::test_run_writes_every_tag_with_plausible_values",),
        "a server is not started in the suite; the test reads a real run's event files with TensorBoard's own "
        "loader (EventAccumulator), the one the server uses, and checks every tag"),
    ".venv/bin/populora report runs/cpu-smoke-population-s0": Cover(
        (AFTER_MAIN_JOB,),
        "run verbatim on a tiny-random stand-in of the main job's run, in the README's order"),
    ".venv/bin/populora eval runs/cpu-smoke-population-s0 --benchmarks humaneval,gsm8k --limit 10": Cover(
        (AFTER_MAIN_JOB, "tests/evaluation/test_progress.py::test_a_killed_eval_keeps_its_rows_and_the_next_call_resumes"),
        "run as written (plus --max-new-tokens 16: tiny-random never stops) on a tiny-random stand-in of the main "
        "job's run; the CLI entry killed and resumed"),
    ".venv/bin/populora report runs/cpu-smoke-population-s0 runs/cpu-smoke-baseline-s0": Cover(
        (AFTER_MAIN_JOB, "tests/selfplay/test_logging_contract.py::test_report_draws_the_matrix_retention_and_roles"),
        "run verbatim on tiny-random stand-ins of the main job's population and baseline runs"),
    ".venv/bin/populora eval runs/cpu-smoke-population-s0 --baseline runs/cpu-smoke-baseline-s0 --benchmarks "
    "humaneval,gsm8k --limit 10": Cover(
        (AFTER_MAIN_JOB, "tests/evaluation/test_runner.py::test_run_eval_tiny_population"),
        "run as written (plus --max-new-tokens 16) on tiny-random stand-ins of both runs; a tiny-random population "
        "with a baseline run through run_eval"),
    ".venv/bin/populora compare --preset cpu-compare --seeds 3 --parallel 2 --out runs/cpu-compare": Cover(
        ("tests/test_compare.py::test_compare_takes_the_staleness_as_an_arm_override",
         "tests/test_compare.py::test_plan_threads_and_commands"),
        "six SmolLM2 runs (~2 h) are too long for the suite: compare end to end on tiny-random with --parallel 2 "
        "(two arms run and compared) and its plan with --parallel threads; cpu-compare's arms resolve here "
        "(dry-run); compare killed, resumed and idempotent runs in CI's end-to-end tier"),
    ".venv/bin/populora train --plugins my_scheme.py --preset my.json --model tiny-random --steps 1": Cover(
        ("tests/selfplay/test_plugins.py::test_readme_plugin_example_runs_and_the_scheme_gets_its_kwargs",),
        "runs exactly the README's plugin example (its my_scheme.py, my.json and command)"),
    ".venv/bin/populora train --preset tiny --plugins examples/estimator.py --trainer.advantage group_median": Cover(
        ("tests/test_examples.py::test_estimator_example_runs_passes_test_estimator_and_resolves_in_a_run",
         "tests/agents/test_advantages.py::test_registering_a_new_estimator_makes_it_available"),
        "the example estimator is resolved in a run's configuration (--dry-run: the plugin is imported and its "
        "name and settings checked); a registered estimator trains in the mapped test of the registry"),
    ".venv/bin/populora list": Cover(
        ("tests/selfplay/test_cli_discovery.py::test_list_includes_a_plugin_and_every_kind",),
        "every kind listed, with a plugin's entries"),
    ".venv/bin/populora test-scheme --plugins my_scheme.py gentle": Cover(
        ("tests/test_examples.py::test_reward_scheme_example_plays_a_round_and_passes_test_scheme",
         "tests/selfplay/test_cli_discovery.py::test_test_scheme_prints_every_branch_for_a_builtin_and_a_plugin"),
        "the README's gentle scheme (examples/reward_scheme.py) through test-scheme, and a plugin's branches"),
}

# Paths that name the user's own files in README commands, replaced by existing ones for the --dry-run check.
PLACEHOLDER_MODEL = "/models/Qwen2.5-Coder-7B"


# ------------------------------------------------------------------------------------------------ parsing


def _logical_lines(text: str) -> list[str]:
    """Shell lines of ``text``: continuations joined, comments and blank lines dropped, spaces normalised."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)
        line = " ".join(line.split())
        if line:
            out.append(line)
    return out


def _parts(line: str) -> list[str]:
    return [" ".join(p.split()) for p in line.split("&&") if p.strip()]


def readme_commands(text: str | None = None) -> list[tuple[str, str]]:
    """``(line, command)`` for every README command: ``line`` is the whole shell line it came from."""
    text = README.read_text(encoding="utf-8") if text is None else text
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        lines += _logical_lines(block)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if COMMAND_START.match(span):
            lines += _logical_lines(span)
    return [(line, cmd) for line in lines for cmd in _parts(line)]


def ci_lines() -> set[str]:
    lines = set(_logical_lines(CI.read_text(encoding="utf-8")))
    return lines | {p for line in lines for p in _parts(line)}


def _readme_block(region: str, lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    if region:
        text = text.split(f"<!-- {region}:start -->")[1].split(f"<!-- {region}:end -->")[0]
    blocks = re.findall(rf"```{lang}\n(.*?)```", text, re.S)
    assert blocks, (region, lang)
    return blocks[0]


# ------------------------------------------------------------------------------------------------- checks


def _is_slow(expr: ast.expr) -> bool:
    """A mark that keeps a test out of the default suite: ``slow``, or the end-to-end tier ``e2e``."""
    return re.fullmatch(r"(pytest\.)?mark\.(slow|e2e)", ast.unparse(expr)) is not None


def _node_exists(node: str) -> None:
    """The test function exists at module level and neither it, its module nor the named parameter set is marked
    ``slow`` (read from the source: importing every mapped module would cost seconds)."""
    path, _, name = node.partition("::")
    name, _, param = name.partition("[")
    param = param.rstrip("]")
    assert (ROOT / path).is_file(), f"{node}: no file {path}"
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    assert len(fns) == 1 and name.startswith("test"), f"{node}: no test function {name} in {path}"
    if param:
        assert any(param in ast.unparse(d) for d in fns[0].decorator_list), f"{node}: no parameter set {param!r}"
    slow = [d for d in fns[0].decorator_list if _is_slow(d)]
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets):
            slow += [e for e in ast.walk(n.value) if _is_slow(e)]
    for call in (c for d in fns[0].decorator_list for c in ast.walk(d) if isinstance(c, ast.Call)):
        if ast.unparse(call.func).endswith("param"):  # pytest.param(..., marks=...): slow only for its id
            ids = {a.value for a in call.args if isinstance(a, ast.Constant)}
            if not param or param in ids:
                slow += [e for k in call.keywords if k.arg == "marks" for e in ast.walk(k.value) if _is_slow(e)]
    assert not slow, (f"{node} is marked slow or e2e: the default suite does not run it (name a parameter set or a "
                      "test that it runs)")


def _run_main(argv: list[str]) -> tuple[int, str]:
    from populora_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # --help (tyro, argparse) exits
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue() + err.getvalue()


def _flags(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("--") and a != "--"]


@pytest.fixture
def readme_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A working folder holding the files the README has the reader write and the repository's examples/, and
    a model folder for the placeholder path; registrations made by the README's plugins are removed
    afterwards."""
    from agents.advantages import list_advantages, unregister_advantage
    from populora_env import list_reward_schemes, unregister_reward_scheme

    (tmp_path / "my_scheme.py").write_text(_readme_block("plugin-example", "python"))
    (tmp_path / "my.json").write_text(_readme_block("plugin-example", "json"))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")  # help text: no flag name wrapped
    schemes, estimators = set(list_reward_schemes()), set(list_advantages())
    yield {PLACEHOLDER_MODEL: str(model)}
    for name in set(list_reward_schemes()) - schemes:
        unregister_reward_scheme(name)
    for name in set(list_advantages()) - estimators:
        unregister_advantage(name)


def _check_flags(cmd: str, subs: dict[str, str]) -> None:
    """The README's exact flags of a ``populora`` command are accepted (see the module docstring)."""
    argv = [subs.get(a, a) for a in shlex.split(cmd)]
    assert Path(argv[0]).name == "populora", cmd
    sub, args = argv[1], argv[2:]
    if sub in ("train", "baseline") and "--resume" not in args:
        rc, out = _run_main([sub, *args, "--dry-run"])
        assert rc == 0, f"{cmd}\n{out[-2000:]}"
        return
    own, _, extra = " ".join(args).partition(" -- ")
    rc, out = _run_main([sub, "--help"])
    assert rc == 0, f"populora {sub} --help: exit {rc}\n{out[-2000:]}"
    missing = [f for f in _flags(own.split()) if f not in out]
    assert not missing, f"{cmd}: populora {sub} --help does not list {missing}"
    if sub == "compare":  # the arms' runs are resolved as compare resolves them
        preset = args[args.index("--preset") + 1]
        for arm in ("train", "baseline"):
            rc, out = _run_main([arm, "--preset", preset, *extra.split(), "--dry-run"])
            assert rc == 0, f"{cmd}: {arm} --preset {preset}\n{out[-2000:]}"


# -------------------------------------------------------------------------------------------------- tests


def test_readme_is_a_guide_of_at_most_250_lines() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}: measurements go to docs/results.md)"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    """The README's two set-up commands: the main job and the tests; .ci/run runs the second verbatim."""
    text = README.read_text(encoding="utf-8")
    setup = [ln for b in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in _logical_lines(b)
             if ln.startswith("bash scripts/install.sh && ")]
    assert setup == ["bash scripts/install.sh && .venv/bin/populora train",
                     "bash scripts/install.sh && .venv/bin/python -m pytest -q"], setup
    assert setup[1] in _logical_lines(CI.read_text(encoding="utf-8"))


def classify(text: str | None = None) -> tuple[list[str], list[str], list[tuple[str, Cover]]]:
    """The README's commands as (unrun, run here with ``--help``, mapped with their cover); ``.ci/run``'s are
    dropped."""
    ci = ci_lines()
    unrun: list[str] = []
    helps: list[str] = []
    mapped: list[tuple[str, Cover]] = []
    for line, cmd in readme_commands(text):
        if line in ci or cmd in ci:
            continue
        if cmd.split()[-1] == "--help" and Path(cmd.split()[0]).name == "populora":
            helps.append(cmd)
        elif cmd in COVERED:
            mapped.append((cmd, COVERED[cmd]))
        else:
            unrun.append(cmd)
    return unrun, helps, mapped


def test_every_readme_command_is_run(readme_files: dict[str, str]) -> None:
    unrun, helps, mapped = classify()
    assert not unrun, ("README commands that no test and not .ci/run runs (run them in a test and add them to "
                       "COVERED in tests/test_readme.py, or take them out of the README):\n" + "\n".join(unrun))
    assert len(helps) + len(mapped) >= 10, (helps, mapped)  # the parser still finds the README's commands
    for cmd in helps:
        rc, out = _run_main(shlex.split(cmd)[1:])
        assert rc == 0 and "--" in out, f"{cmd}: exit {rc}\n{out[-2000:]}"
    for cmd, cover in mapped:
        for node in cover.tests:
            _node_exists(node)
        if Path(cmd.split()[0]).name == "populora":
            _check_flags(cmd, readme_files)


def test_every_readme_command_is_written_as_a_new_user_runs_it() -> None:
    """From the checkout's root, with the installer's venv: ``.venv/bin/...`` (or the installer itself)."""
    bare = [c for _, c in readme_commands() if not c.startswith((".venv/bin/", "bash scripts/install.sh"))]
    assert not bare, f"README commands without their .venv/bin/ prefix: {bare}"


def test_the_mapping_names_only_readme_commands() -> None:
    stale = set(COVERED) - {cmd for _, cmd in readme_commands()}
    assert not stale, f"COVERED maps commands the README no longer has: {sorted(stale)}"


def test_a_command_nobody_runs_is_reported() -> None:
    """Commands are found in blocks (continued lines, comments, &&) and in prose; a new one is reported unrun,
    .ci/run's and --help ones are not, a mapped one is."""
    text = ("Run `bash scripts/install.sh` and `populora eval` (a name), then\n\n```bash\n"
            ".venv/bin/populora train --steps 2 \\\n    --seed 3   # a comment\nbash x.sh && .venv/bin/populora "
            "baseline\n```\n`.venv/bin/populora train --help` and `populora train --steps 1`.\n")
    cmds = [c for _, c in readme_commands(text)]
    assert cmds == [".venv/bin/populora train --steps 2 --seed 3", "bash x.sh", ".venv/bin/populora baseline",
                    "bash scripts/install.sh", ".venv/bin/populora train --help", "populora train --steps 1"]
    unrun, helps, mapped = classify(text)
    assert unrun == [".venv/bin/populora train --steps 2 --seed 3", "bash x.sh", "populora train --steps 1"]
    assert helps == [".venv/bin/populora train --help"]
    assert [c for c, _ in mapped] == [".venv/bin/populora baseline"]


@pytest.mark.parametrize("cmd", [
    ".venv/bin/populora train --preset cpu-smoke --stepz 2",  # a renamed flag
    ".venv/bin/populora baseline --preset no-such-preset",  # a removed preset
    ".venv/bin/populora eval runs/x --benchmark-list humaneval",  # a flag eval does not have
    ".venv/bin/populora compare --preset cpu-compare --seeds 3 --paralel 2 --out runs/c",
])
def test_a_readme_command_with_a_wrong_flag_fails_the_check(cmd: str, readme_files: dict[str, str]) -> None:
    with pytest.raises(AssertionError):
        _check_flags(cmd, readme_files)


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_links_resolve() -> None:
    """Every relative link of the README names an existing file and, with ``#anchor``, one of its headings."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            bad.append(f"{target}: no file {path}")
            continue
        if anchor:
            headings = [ln.lstrip("#").strip() for ln in (ROOT / path).read_text(encoding="utf-8").splitlines()
                        if ln.startswith("#")]
            if anchor not in {_slug(h) for h in headings}:
                bad.append(f"{target}: {path} has no heading with anchor #{anchor}")
    assert not bad, "\n".join(bad)


def test_every_flag_the_readme_names_exists(readme_files: dict[str, str]) -> None:
    """A flag named anywhere in the README (prose included: ``--trainer.advantage``, ``--override``, ...) is one
    that some ``populora`` sub-command documents in its ``--help``."""
    text = README.read_text(encoding="utf-8")
    text = "\n".join(ln for ln in text.splitlines()  # TensorBoard's own flag is not ours
                     if not re.match(r"(\.venv/bin/)?tensorboard ", ln.lstrip("`")))
    named = set(re.findall(r"(?<![\w-])(--[a-z][\w.-]*[a-z0-9])", text))
    helps = ""
    for sub in ("train", "eval", "compare", "report", "evolve"):
        rc, out = _run_main([sub, "--help"])
        assert rc == 0, (sub, out[-2000:])
        helps += out
    documented = set(re.findall(r"(?<![\w-])(--[a-z][\w.-]*[a-z0-9])", helps))
    assert {"--preset", "--resume", "--steps", "--run-dir", "--model"} <= named
    assert not named - documented, f"README flags no --help documents: {sorted(named - documented)}"
