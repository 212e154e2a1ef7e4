"""The game from the trainers researchers already use: four bridges, each an optional extra (docs/index.md lists their pages).

- :mod:`populora_bridges.single_seat`: one agent's seat as a ``gymnasium.Env`` (no extra: gymnasium is a
  dependency of the game);
- :mod:`populora_bridges.openenv_server` and :mod:`populora_bridges.openenv_client`: an OpenEnv server holding one
  game per session, and its client (``pip install -e ".[openenv]"``);
- :mod:`populora_verifiers` (a top-level package: verifiers imports an environment by a top-level name): a
  verifiers environment package (``pip install -e ".[verifiers]"``);
- :mod:`populora_bridges.grpo`: TRL's ``GRPOTrainer`` training students or teachers on the game
  (``pip install -e ".[trl]"``).

Every bridge plays the env's own rounds (``env.step`` with the env's reward scheme): no reward is computed here.
Importing this package imports no extra; each bridge imports its library inside its own module. Layers: this
package sits beside ``agents``/``evolution`` and imports only the game, except :mod:`populora_bridges.grpo`, which
needs the learning stack and the run directory and sits beside ``baselines``/``evaluation`` (docs/design.md).
"""

from populora_bridges.single_seat import SingleSeatEnv

__all__ = ["SingleSeatEnv"]
