"""Every file in ``examples/`` runs, as a reader runs it (``python examples/NAME.py`` in a fresh interpreter),
and shows what its docstring says it shows; ``play_one_round.py`` stays within 25 lines of code."""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from tests.selfplay.conftest import cli_env, populora

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path | None = None) -> str:
    p = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=600,
                       env=cli_env(), cwd=cwd or ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not the module docstring."""
    source = path.read_text(encoding="utf-8")
    doc = ast.parse(source).body[0]
    skip = set(range(doc.lineno, doc.end_lineno + 1)) if isinstance(doc, ast.Expr) else set()
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - skip)


# The bridges' examples need their extras: tests/bridges/ runs them (test_trl.py, test_openenv.py,
# test_verifiers.py), skipped where the extra is absent except under CI's bridges step.
BRIDGE_EXAMPLES = {"trl_students.py": "test_trl.py", "trl_teachers.py": "test_trl.py",
                   "openenv_round.py": "test_openenv.py", "verifiers_round.py": "test_verifiers.py"}


def test_every_example_is_tested_here() -> None:
    tested = {"play_one_round.py", "own_learner.py", "reward_scheme.py", "estimator.py", "train_from_python.py",
              "complexity_scheme.py", "novelty_scheme.py", "pbt_rules.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested | set(BRIDGE_EXAMPLES)
    for name, test in BRIDGE_EXAMPLES.items():
        assert f'run_example("{name}"' in (ROOT / "tests" / "bridges" / test).read_text(encoding="utf-8"), name


def test_play_one_round_pays_a_correct_answer_in_at_most_25_lines() -> None:
    assert code_lines(EXAMPLES / "play_one_round.py") <= 25
    out = run_example("play_one_round.py")
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert "'valid': True" in lines["proposal"]
    per_completion = ast.literal_eval(lines["per completion"])
    assert per_completion["student_0"] == [1.0, -0.5]  # the right answer first: a non-zero reward
    assert per_completion["teacher_0"] == [0.5]  # 1 - p̂ with p̂ = 1/2


def test_code_lines_counts_code_only(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text('"""Doc\n\nmore doc."""\n\n# a comment\nx = (1,\n     2)  # trailing\n\nprint(x)\n')
    assert code_lines(f) == 3


def test_own_learner_learns_against_the_env() -> None:
    out = run_example("own_learner.py")
    learned = {k: float(v) for k, v in (line.rsplit(": ", 1) for line in out.splitlines())}
    assert learned["P(teacher proposes the invalid task)"] < 0.1  # from 1/4
    assert learned["P(student answers right)"] > 0.9  # from 1/3


def test_reward_scheme_example_plays_a_round_and_passes_test_scheme() -> None:
    out = run_example("reward_scheme.py")
    rewards = ast.literal_eval(out.strip().splitlines()[-1])
    assert rewards["teacher_0"] == [0.5, 0.5] and rewards["student_0"] == [1.0, -1.0, 1.0, -1.0]
    p = populora("test-scheme", "--plugins", "examples/reward_scheme.py", "gentle", "--kwargs",
                 '{"invalid": -0.25}', timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "invalid proposal (fails validation)           -0.250" in p.stdout


def _scheme_rows(*args: str) -> dict[tuple[str, str, str], float]:
    """``populora test-scheme ARGS``'s table: (round, agent, branch) -> reward."""
    p = populora("test-scheme", *args, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    rows, title = {}, ""
    for line in p.stdout.splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("    "):
            title = line.strip().rstrip(":")
        elif line.strip() and not line.rstrip().endswith(" -"):
            agent, rest = line.split(None, 1)
            branch, value = rest.rsplit(None, 1)
            rows[(title, agent, branch.strip())] = float(value)
    return rows


@pytest.mark.parametrize("name", ["complexity_scheme.py", "novelty_scheme.py"])
def test_the_whole_game_scheme_examples_are_short_and_run(name: str) -> None:
    assert code_lines(EXAMPLES / name) <= 25
    out = run_example(name)
    assert "valid task, solved at half (p̂ = 0.5)" in out


def test_the_complexity_scheme_pays_a_nonzero_bonus_and_penalty_in_test_scheme() -> None:
    """Against the ``populora`` rewards it adds to: every valid task earns a bonus growing with its program's
    cyclomatic complexity, every attempt pays a penalty growing with its token count, invalid ones are as is."""
    base = _scheme_rows("populora")
    mine = _scheme_rows("--plugins", "examples/complexity_scheme.py", "complexity")
    assert mine.keys() == base.keys()
    delta = {k: round(mine[k] - base[k], 6) for k in base}
    teacher = {k[2]: d for k, d in delta.items() if k[1] == "teacher_0"}
    student = [d for k, d in delta.items() if k[1] == "student_0"]
    solved = "solved and unsolved tasks"
    bonus = [delta[(solved, "teacher_0", b)] for b in ("valid task, solved at every attempt (p̂ = 1)",
                                                       "valid task, solved at half (p̂ = 0.5)",
                                                       "valid task, never solved (p̂ = 0)")]
    assert 0 < bonus[0] < bonus[1] < bonus[2]  # the scripted programs rise in complexity
    assert teacher["invalid proposal (fails validation)"] == 0.0 and teacher["badly formatted proposal"] == 0.0
    assert student and all(d < 0 for d in student)
    assert len(set(student)) > 1  # longer answers pay more


def test_the_novelty_scheme_pays_only_programs_new_to_the_buffers() -> None:
    base = _scheme_rows("populora")
    mine = _scheme_rows("--plugins", "examples/novelty_scheme.py", "novelty")
    delta = {k: round(mine[k] - base[k], 6) for k in base}
    solved = "solved and unsolved tasks"
    assert delta[(solved, "teacher_0", "valid task, solved at every attempt (p̂ = 1)")] == 0.0  # a seed's program
    assert delta[(solved, "teacher_0", "valid task, never solved (p̂ = 0)")] == 0.5
    assert delta[("invalid proposals and filler attempts", "teacher_0", "valid induction task (p̂ = 0.5)")] == 0.0
    assert all(d == 0.0 for k, d in delta.items() if k[1] == "student_0")


def test_estimator_example_runs_passes_test_estimator_and_resolves_in_a_run() -> None:
    out = run_example("estimator.py")
    assert "tensor([[0.7500, 0.7500, 0.0000]," in out
    p = populora("test-estimator", "--plugins", "examples/estimator.py", "group_median", timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "group d of one                    +1.00      5    +0.000" in p.stdout
    p = populora("train", "--preset", "tiny", "--plugins", "examples/estimator.py", "--trainer.advantage",
                 "group_median", "--trainer.advantage-kwargs", '{"scale": 0.5}', "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["trainer"]["advantage_kwargs"] == {"scale": 0.5}


def test_train_from_python_runs_both_arms_and_compares(tmp_path: Path) -> None:
    out = run_example("train_from_python.py", cwd=tmp_path)
    assert out.splitlines()[0] == "runs/pop -1.0"  # a tiny-random teacher's tasks are all invalid: -1
    assert "population: 2 steps" in out and "baseline: 2 steps" in out
    assert (tmp_path / "runs" / "cmp" / "compare.md").is_file()
    assert (tmp_path / "runs" / "pop" / "report" / "summary.md").is_file()
    summary = json.loads((tmp_path / "runs" / "pop" / "run_summary.json").read_text())
    assert [h["step"] for h in summary["history"]] == [1, 2]


def test_the_readme_api_example_is_the_one_run_here() -> None:
    """Every line of the README's Python API block is a line of examples/train_from_python.py, which the test
    above runs: the README's example is run, not only shown."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "from populora_cli import" in b)
    example = {ln.strip() for ln in (EXAMPLES / "train_from_python.py").read_text(encoding="utf-8").splitlines()}
    missing = [ln for ln in block.splitlines() if ln.strip() and ln.strip() not in example]
    assert not missing, missing


@pytest.mark.parametrize("name", ["play_one_round.py", "own_learner.py", "reward_scheme.py", "estimator.py",
                                  "train_from_python.py", "complexity_scheme.py", "novelty_scheme.py",
                                  *BRIDGE_EXAMPLES])
def test_examples_are_linked_from_the_readme_and_the_docs_map(name: str) -> None:
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        assert f"examples/{name}" in page.read_text(encoding="utf-8"), (page.name, name)


def test_pbt_rules_example_decides_in_the_testers_and_resolves_in_a_run() -> None:
    p = populora("test-selection", "--plugins", "examples/pbt_rules.py", "worst_one", "--fitness", "recent_reward",
                 timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "m0: the least fit; mutation parent m5; crossover parents m4 + m5" in p.stdout
    p = populora("test-matching", "--plugins", "examples/pbt_rules.py", "near_even", "--kwargs", '{"width": 0.1}',
                 timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = {ln.split()[0]: int(ln.split()[-1]) for ln in p.stdout.splitlines()[2:]}
    assert counts["s_even"] > counts["s_below"] > counts["s_weak"] + counts["s_strong"]
    p = populora("train", "--preset", "tiny", "--plugins", "examples/pbt_rules.py", "--pbt.selection", "worst_one",
                 "--pbt.fitness", "recent_reward", "--env.matching", "near_even", "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = json.loads(p.stdout)
    assert (cfg["pbt"]["selection"], cfg["pbt"]["fitness"], cfg["env"]["matching"]) == \
        ("worst_one", "recent_reward", "near_even")
