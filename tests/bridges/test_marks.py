"""The bridges' tests skip where their extra is missing, and fail instead under CI's bridges step."""

from __future__ import annotations

import pytest

from tests.bridges.marks import REQUIRE, extra_marks


def test_a_missing_extra_skips_and_under_the_switch_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE, raising=False)
    (mark,) = extra_marks("nothing", ("populora_no_such_module",))
    assert mark.args == (True,) and "'nothing' extra" in mark.kwargs["reason"]
    (present,) = extra_marks("test", ("pytest",))
    assert present.args == (False,)
    monkeypatch.setenv(REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match="not importable"):
        extra_marks("nothing", ("populora_no_such_module",))
