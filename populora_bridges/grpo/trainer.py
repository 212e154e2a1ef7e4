"""TRL's ``GRPOTrainer`` set up on a game's rounds, and its outputs saved beside the rounds that replay them
(docs/trl.md).

:func:`grpo_trainer` is ``GRPOTrainer(model, reward_funcs=game.reward, train_dataset=game.dataset(rounds),
args=GRPOConfig(...))`` with what the bridge relies on set once: ``num_generations`` is the game's group size
(the env's ``samples_per_task`` for students, the replays per prompt for teachers), ``log_completions`` writes
each step's completions table (the completions, the rewards TRL received, their rounds and verdicts), and
nothing is reported to a remote tracker unless asked. Every other ``GRPOConfig`` field is the caller's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from populora_bridges.grpo.rounds import GameRounds

SMOKE = {"max_steps": 2, "per_device_train_batch_size": 8, "max_completion_length": 2, "learning_rate": 5e-3,
         "logging_steps": 1, "use_cpu": True, "seed": 0, "save_strategy": "no", "bf16": False}
"""``GRPOConfig`` fields of a smoke run on ``tiny-random`` on CPU (the examples, the tests): 2 steps, 8
completions a step (2 prompts x 4), 2 tokens each, a large learning rate, every step logged, nothing saved until
:func:`save_outputs`."""


def smoke_lora() -> Any:
    """The smoke run's LoRA: rank 4, alpha 8, on the attention's query and value projections."""
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def grpo_trainer(game: GameRounds, model: Any, tokenizer: Any, output_dir: str | Path, *, rounds: int,
                 peft_config: Any = None, **grpo_args: Any):
    """A ``trl.GRPOTrainer`` training ``model`` on ``rounds`` rounds of ``game`` (``grpo_args``: ``GRPOConfig``
    fields).

    Raises:
        ValueError: ``num_generations`` differs from the game's group size.
    """
    from trl import GRPOConfig, GRPOTrainer

    if grpo_args.get("num_generations", game.num_generations) != game.num_generations:
        raise ValueError(f"num_generations={grpo_args['num_generations']}: the game's groups have "
                         f"{game.num_generations} completions")
    settings = {"log_completions": True, "num_completions_to_print": 0, "report_to": [], **grpo_args,
                "num_generations": game.num_generations}
    args = GRPOConfig(output_dir=str(output_dir), **settings)
    return GRPOTrainer(model=model, reward_funcs=game.reward, args=args, train_dataset=game.dataset(rounds),
                       processing_class=tokenizer, peft_config=peft_config)


def save_outputs(trainer: Any, game: GameRounds, output_dir: str | Path) -> dict[str, Any]:
    """Save the adapter (``adapter/``), TRL's state (``trainer_state.json``) and the rounds (``rounds.json``) in
    ``output_dir``, close the game, and return the steps trained and the last value of each ``game/`` metric."""
    out = Path(output_dir)
    trainer.save_model(str(out / "adapter"))
    trainer.save_state()
    game.save(out / "rounds.json")
    game.close()
    logged = {k: v for row in trainer.state.log_history for k, v in row.items() if k.startswith("game/")}
    return {"steps": trainer.state.global_step, "game": logged}
