"""What the ``populora`` command prints besides its results: log levels, warnings, progress bars of the
libraries it uses, and the summary at the end of a run.

Three levels, set by ``--verbose`` / ``--quiet`` anywhere on the command line of any sub-command:

* default: the project's own INFO lines (a run's step lines, what eval does) and every WARNING; the libraries'
  INFO lines (TensorBoard's "No path found ...") hidden, their ``FutureWarning`` / ``DeprecationWarning``
  (a transformers deprecation the project cannot act on) hidden, transformers' "Loading weights" bar off;
* ``--verbose``: everything: every library's INFO lines, every warning, the loading bars;
* ``--quiet``: warnings and errors only, and the one-line summary of where a finished run is.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from populora_cli.api import Run

__all__ = ["PROJECT_PACKAGES", "QUIET", "VERBOSE", "configure", "program", "summary", "take_verbosity"]

PROJECT_PACKAGES = ("populora_env", "agents", "evolution", "selfplay", "baselines", "evaluation", "populora_cli")
QUIET, DEFAULT, VERBOSE = -1, 0, 1
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def take_verbosity(argv: Sequence[str]) -> tuple[list[str], int]:
    """``argv`` without ``--verbose`` / ``--quiet`` (before a ``--`` that ends the command's own flags) and the
    level they set (the last one given wins)."""
    rest: list[str] = []
    level = DEFAULT
    passthrough = False
    for a in argv:
        if not passthrough and a in ("--verbose", "--quiet"):
            level = VERBOSE if a == "--verbose" else QUIET
            continue
        passthrough = passthrough or a == "--"
        rest.append(a)
    return rest, level


def configure(level: int = DEFAULT) -> None:
    """Set log levels, warning filters and the libraries' progress bars for ``level`` (see the module
    docstring). Call it before anything imports transformers (its bars are switched by the environment). The log
    levels are set only where nobody configured logging yet (the root logger has no handler)."""
    root = logging.getLogger()
    if not root.handlers:  # logging set up by someone else (an application, pytest) is left as they set it
        logging.basicConfig(format=FORMAT)
        root.setLevel(logging.INFO if level >= VERBOSE else logging.WARNING)
        for name in PROJECT_PACKAGES:
            logging.getLogger(name).setLevel(logging.WARNING if level <= QUIET else logging.INFO)
    if level >= VERBOSE:
        warnings.simplefilter("default")
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read by huggingface_hub when it loads
    for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
        for name in PROJECT_PACKAGES:  # the project's own deprecations still show
            warnings.filterwarnings("default", category=category, module=rf"{name}(\.|$)")


def program() -> str:
    """How the user called the command (``.venv/bin/populora`` or ``populora``), so the next command printed
    works as shown."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("populora")
    return str(argv0) if argv0.name == "populora" else "populora"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60)} s"


def summary(run: Run, level: int = DEFAULT) -> str:
    """The end of a run in a few lines: steps and time, the last step's rates and rewards, where the run is and
    what to run next (``--quiet``: the first two lines only)."""
    prog = program()
    rates = []
    for key, label in (("valid_rate", "valid"), ("solve_rate", "solve"), ("teacher_reward", "teacher reward"),
                       ("student_reward", "student reward")):
        last = run.last(key)
        if last is None:
            rates.append(f"{label} -")
        else:
            at = "" if last[0] == run.steps else f" (step {last[0]})"
            rates.append(f"{label} {last[1]:.3f}{at}")
    head = (f"finished: {run.steps} step{'s' * (run.steps != 1)} ({run.arm}; {_seconds(run.seconds)} in this call), "
            f"last step: {', '.join(rates)}")
    lines = [head, f"run directory: {run.run_dir}"]
    if level <= QUIET:
        return "\n".join(lines)
    if run.report is not None:
        lines.append(f"  report: {run.report / 'summary.md'} and its figures")
    tensorboard = Path(prog).with_name("tensorboard") if "/" in prog else Path("tensorboard")
    lines += ["next:",
              f"  {prog} eval {run.run_dir} --benchmarks humaneval,gsm8k --limit 10   # score the members",
              f"  {tensorboard} --logdir {run.run_dir}   # every logged value"]
    return "\n".join(lines)
