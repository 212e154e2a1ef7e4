"""Every I/O failure of ``populora evolve`` and ``populora eval`` exits 2 naming the file; ``evolve`` refuses a
non-finite child naming the parameters; a plugin that exits at import is reported as such (exit 2). In process
(``populora_cli.main.main``) so that each case takes well under a second after the first."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from populora_cli.main import main
from tests.selfplay.conftest import read_only_tree


@pytest.fixture(scope="module")
def parents(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    d = tmp_path_factory.mktemp("parents")
    base, _tok = load_base("tiny-random")
    pop = LoRAPopulation(base, ["p1", "p2"], rank=4, alpha=8, seed=0)
    for i, n in enumerate(("p1", "p2")):
        randomize_member(pop, n, std=0.05, seed=i)
        pop.save(n, d / n)
    return d / "p1", d / "p2"


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


@pytest.mark.parametrize(("op", "n", "param", "name"), [
    ("task_arithmetic", 2, "weights=1e300,1e300", "weights"),
    ("extrapolate", 2, "eta=1e300", "eta"),
    ("svd_mutation", 1, "epsilon=1e3", "epsilon"),
    ("layer_mutation", 1, "epsilon=1e300", "epsilon"),
    ("adaptive_noise", 1, "epsilon=1e300", "epsilon"),
])
def test_evolve_refuses_a_non_finite_child(parents, tmp_path: Path, capsys, op: str, n: int, param: str,
                                           name: str) -> None:
    out = tmp_path / "child"
    rc, err = _run(capsys, "evolve", "--op", op, "--parents", *map(str, parents[:n]), "--out", str(out),
                   "--param", param)
    assert rc == 2
    assert err.startswith(f"populora evolve: error: --param: operator '{op}' with {param.split('=')[0]}=") and \
        "produced a child with NaN/inf weights" in err and err.endswith(f"choose smaller values of {name}"), err
    assert not out.exists()


def _damaged(parent: Path, tmp_path: Path, how: str) -> Path:
    d = tmp_path / f"damaged_{how}"
    shutil.copytree(parent, d)
    weights, config = d / "adapter_model.safetensors", d / "adapter_config.json"
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) - 100])
    elif how == "header":
        weights.write_bytes(b"\xff" * 8 + data[8:])
    elif how == "garbage_config":
        config.write_text("{ not json")
    elif how == "list_config":
        config.write_text("[1, 2]")
    elif how == "nan":
        state = load_file(str(weights))
        key = sorted(state)[0]
        state[key] = torch.full_like(state[key], float("nan"))
        save_file(state, str(weights))
    return d


DAMAGE = {"truncated": "adapter_model.safetensors: not a readable safetensors file",
          "header": "adapter_model.safetensors: not a readable safetensors file",
          "garbage_config": "adapter_config.json: not a readable adapter config",
          "list_config": "adapter_config.json: not an adapter config (a JSON object), got list",
          "nan": "adapter_model.safetensors: tensor base_model"}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_evolve_on_a_damaged_parent_names_the_file(parents, tmp_path: Path, capsys, how: str) -> None:
    bad = _damaged(parents[0], tmp_path, how)
    rc, err = _run(capsys, "evolve", "--op", "ties", "--parents", str(parents[1]), str(bad), "--out",
                   str(tmp_path / "child"))
    assert rc == 2 and err.startswith(f"populora evolve: error: --parents: {bad}/{DAMAGE[how]}"), err


def test_evolve_out_on_a_file_names_it(parents, tmp_path: Path, capsys) -> None:
    f = tmp_path / "a_file"
    f.write_text("")
    rc, err = _run(capsys, "evolve", "--op", "ties", "--parents", *map(str, parents), "--out", str(f))
    assert (rc, err) == (2, f"populora evolve: error: --out: {f} exists and is not a directory")
    rc, err = _run(capsys, "evolve", "--op", "ties", "--parents", *map(str, parents), "--out", str(f / "child"))
    assert rc == 2 and err.startswith(f"populora evolve: error: cannot write --out {f / 'child'}: "), err
    assert str(f) in err


@pytest.mark.parametrize("how", ["truncated", "garbage_config"])
def test_eval_on_a_damaged_adapter_names_the_file(parents, tmp_path: Path, capsys, how: str) -> None:
    run = tmp_path / "run"
    (run / "adapters").mkdir(parents=True)
    (run / "config.json").write_text('{"name": "run", "model": "tiny-random", "config": {}}')
    shutil.copytree(parents[0], run / "adapters" / "a")
    shutil.copytree(_damaged(parents[1], tmp_path, how), run / "adapters" / "b")
    rc, err = _run(capsys, "eval", str(run), "--benchmarks", "humaneval", "--limit", "1")
    assert rc == 2 and err.startswith(f"populora eval: error: {run / 'adapters' / 'b'}/{DAMAGE[how]}"), err


@pytest.mark.parametrize(("body", "said"), [("import sys\nsys.exit(7)\n", "exited with 7"),
                                            ("raise SystemExit\n", "exited with 0"),
                                            ("raise KeyboardInterrupt\n", "exited with KeyboardInterrupt")])
def test_a_plugin_that_exits_at_import_exits_2(tmp_path: Path, capsys, body: str, said: str) -> None:
    plugin = tmp_path / "quits.py"
    plugin.write_text(body)
    rc, err = _run(capsys, "train", "--plugins", str(plugin), "--model", "tiny-random", "--dry-run")
    assert (rc, err) == (2, f"populora train: error: --plugins: plugin {str(plugin)!r} {said} while importing")


@contextmanager
def read_only_copy(src: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of ``src`` that cannot be written (:func:`tests.selfplay.conftest.read_only_tree`)."""
    with read_only_tree(tmp_path / "ro", lambda mount: shutil.copytree(src, mount / "run")) as mount:
        yield mount / "run"


def test_report_and_eval_on_a_read_only_run_say_so_in_one_line(tiny_run: Path, tmp_path: Path, capsys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: ``train --resume`` said so in one line, ``report`` and ``eval`` (and ``compare --out`` there) ended in ``OSError: [Errno 30]``.
    Both now check the folder they write into (default: inside the run) before any work, name it and the way
    out (``--out`` / ``--out-dir``); with it the read-only run is read as any other."""
    import agents.models
    from evaluation import stats

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(agents.models, "load_base", no_model)
    with read_only_copy(tiny_run, tmp_path) as run:
        rc, err = _run(capsys, "report", str(run))
        assert rc == 2 and err.startswith(f"populora report: error: cannot write the report in {run / 'report'}: "), err
        assert err.endswith("; give --out DIR elsewhere"), err
        rc, err = _run(capsys, "eval", str(run), "--benchmarks", "gsm8k", "--limit", "1")
        assert rc == 2 and err.startswith(f"populora eval: error: cannot write the evaluation in {run / 'eval'}: "), err
        assert err.endswith("; give --out-dir DIR elsewhere"), err
        rc, err = _run(capsys, "compare", "--from", str(run), "--out", str(run.parent / "cmp"))
        assert rc == 2 and err.startswith(f"populora compare: error: cannot write the comparison in {run.parent}/cmp: "
                                          if stats.rliable_available() else "populora compare: error: "), err
        assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "summary.md").is_file()
