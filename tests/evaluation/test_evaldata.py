"""The shipped benchmark files are exactly the ones ``evaluation/evaldata/SOURCES.md`` describes.

For every row of the checksum table (SOURCES.md §4): the file exists, its sha256 and the sha256 of its
decompressed content match, and it holds the stated number of problems (non-empty JSON lines, each a JSON
object). Every shipped ``.gz`` file has a row, and every file the loaders name is shipped.

Then the data directory's resolution: argument > ``$POPULORA_EVALDATA`` > the shipped files, compressed or not.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest

import evaluation
from evaluation.data import (
    ENV_VAR,
    FILES,
    SHIPPED_DATA_DIR,
    EvalDataError,
    load_code,
    load_math,
    resolve_data_dir,
)

EVALDATA = Path(evaluation.__file__).resolve().parent / "evaldata"
_ROW = re.compile(r"^\|\s*`(?P<file>[^`]+\.gz)`\s*\|\s*(?P<n>\d+)\s*\|\s*`(?P<sha>[0-9a-f]{64})`\s*\|"
                  r"\s*`(?P<raw>[0-9a-f]{64})`\s*\|\s*$")


def _table() -> dict[str, tuple[int, str, str]]:
    text = (EVALDATA / "SOURCES.md").read_text(encoding="utf-8")
    section = text.split("## §4", 1)[1]
    rows = {}
    for line in section.splitlines():
        m = _ROW.match(line.strip())
        if m:
            rows[m["file"]] = (int(m["n"]), m["sha"], m["raw"])
    return rows


TABLE = _table()


def test_table_lists_every_shipped_file() -> None:
    shipped = sorted(p.name for p in EVALDATA.glob("*.gz"))
    assert shipped, f"no benchmark files in {EVALDATA}"
    assert sorted(TABLE) == shipped


def test_every_loader_file_is_shipped() -> None:
    missing = [name for name in FILES.values() if not (EVALDATA / f"{name.removesuffix('.gz')}.gz").is_file()]
    assert not missing, f"named by evaluation.data.FILES but not shipped: {missing}"


@pytest.mark.parametrize("name", sorted(TABLE))
def test_checksum_and_count(name: str) -> None:
    count, sha, raw_sha = TABLE[name]
    data = (EVALDATA / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha, f"{name}: shipped file differs from SOURCES.md §4"
    raw = gzip.decompress(data)
    assert hashlib.sha256(raw).hexdigest() == raw_sha, f"{name}: content differs from SOURCES.md §4"
    lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
    assert len(lines) == count, f"{name}: {len(lines)} problems, SOURCES.md says {count}"
    assert all(isinstance(json.loads(line), dict) for line in lines)


# --- where the loaders look ---------------------------------------------------------------------------------


def test_default_is_the_shipped_directory(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_data_dir() == SHIPPED_DATA_DIR == EVALDATA
    assert len(load_math("amc23")) == 40
    assert len(load_code("humaneval+", limit=2)) == 2


def test_env_var_then_argument_take_precedence(monkeypatch, tmp_path: Path) -> None:
    """``$POPULORA_EVALDATA`` beats the shipped files, the argument beats both; an uncompressed ``.jsonl`` in a
    user's directory is read like the shipped ``.jsonl.gz``."""
    env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
    rows = [json.loads(line) for line in gzip.open(EVALDATA / "amc23.test.jsonl.gz", "rt")]
    for directory, n in ((env_dir, 3), (arg_dir, 5)):
        directory.mkdir()
        (directory / "amc23.test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
    monkeypatch.setenv(ENV_VAR, str(env_dir))
    assert resolve_data_dir() == env_dir
    assert len(load_math("amc23")) == 3
    assert len(load_math("amc23", arg_dir)) == 5


def test_uncompressed_copy_of_a_gz_release_is_read(tmp_path: Path) -> None:
    raw = gzip.decompress((EVALDATA / "HumanEvalPlus-v0.1.10.jsonl.gz").read_bytes())
    (tmp_path / "HumanEvalPlus-v0.1.10.jsonl").write_bytes(raw)
    shipped = load_code("humaneval+", EVALDATA, limit=3)
    assert load_code("humaneval+", tmp_path, limit=3) == shipped


def test_missing_file_names_both_forms_and_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(EvalDataError) as info:
        load_math("gsm8k", tmp_path)
    msg = str(info.value)
    assert "gsm8k.test.jsonl or gsm8k.test.jsonl.gz" in msg and str(tmp_path) in msg and "--data-dir" in msg
