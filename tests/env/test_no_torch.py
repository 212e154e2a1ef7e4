"""The game never imports torch (docs/design.md: populora_env works with any learning framework)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_every_module_of_populora_env_does_not_import_torch() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import populora_env\n"
        "for m in pkgutil.walk_packages(populora_env.__path__, 'populora_env.'):\n"
        "    importlib.import_module(m.name)\n"
        "from populora_env import parallel_env\n"
        "env = parallel_env(num_teachers=1, num_students=1)\n"
        "env.reset(seed=0)\n"
        "env.step({})\n"
        "env.step({})\n"
        "env.close()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
