"""Train from Python (a notebook, a script): the population and its baseline, then their comparison.

``populora_cli`` exports the API the ``populora`` command runs: ``train`` and ``baseline`` take a preset (a
shipped name or a ``.json`` file), a dict or a ``TrainConfig``, plus settings as keywords (a dict per section:
``trainer={"lr": 1e-3}``), check every value as the command line does (``ConfigError`` names the field), run,
write the report, and return a ``Run``: its directory, configuration and per-step history. ``compare``
compares finished runs of the two arms. The lines of ``main`` are the README's example.

This one trains the ``tiny`` preset (tiny-random, seconds per step) for 2 steps in each arm, into ``runs/pop``
and ``runs/base`` of the working directory (an existing run directory is refused: remove it first).

Run it: ``.venv/bin/python examples/train_from_python.py`` (about half a minute on 2 cores).
"""

from populora_cli import baseline, compare, train
from populora_cli.logs import configure


def main() -> None:
    configure()  # optional: the command line's output (step lines; the libraries' warnings and bars hidden)
    pop = train("tiny", steps=2, run_dir="runs/pop", trainer={"lr": 1e-3})  # a preset + settings, checked first
    base = baseline("tiny", steps=2, run_dir="runs/base", trainer={"lr": 1e-3})
    print(pop.run_dir, pop.history[-1]["teacher_reward"])  # one row per step
    compare([pop, base], out="runs/cmp")  # compare.md, compare.json, figures
    for run in (pop, base):
        print(f"{run.arm}: {run.steps} steps, teacher reward per step {[h['teacher_reward'] for h in run.history]}")


if __name__ == "__main__":
    main()
