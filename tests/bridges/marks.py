"""The marks of the bridges' tests, in one place: a skip where the bridge's extra is not installed, turned into a
failure under CI's bridges step (``POPULORA_REQUIRE_BRIDGES=1``), where a skip would hide a broken install."""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE = "POPULORA_REQUIRE_BRIDGES"


def extra_marks(extra: str, needs: tuple[str, ...]) -> list[pytest.MarkDecorator]:
    """``pytestmark`` for a module that needs every module in ``needs`` (installed by the ``extra`` extra); fails
    the collection when one is missing and ``POPULORA_REQUIRE_BRIDGES=1``."""
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing and os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {missing} not importable (the {extra!r} extra)", pytrace=False)
    return [pytest.mark.skipif(bool(missing), reason=(
        f"needs the {extra!r} extra ({' and '.join(missing)} not importable): "
        f".venv/bin/pip install -c constraints.txt -e '.[{extra}]'"))]
