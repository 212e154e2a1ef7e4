"""Train a student with TRL's GRPOTrainer on the game: the env's solver prompts, the env's rewards.

``populora_bridges.grpo.StudentRounds`` plays rounds of the game with a teacher you choose (here the scripted
``SeedTeacher``; frozen run members or a saved task buffer work the same way, docs/trl.md) and turns each
valid task into one prompt of TRL's dataset; its ``reward`` replays that round with TRL's completions, so every
completion is paid by the env's own sandbox check and reward scheme (+1 right, −0.5 wrong, −1 format error under
``populora``), and the game's metrics (reasons, p̂, pair outcomes) go to TRL's logs (``game/...``).

The model is ``tiny-random`` (noise): the ``small`` prompt set pre-fills the answer's opening, so two tokens of
noise are read as the output value: noise that parses as one expression is a wrong answer (−0.5), anything else
a format error (−1), which is enough reward variance for GRPO to move the LoRA adapter in 2 steps on CPU.

Run it: ``.venv/bin/python examples/trl_students.py [OUT_DIR]`` (needs ``pip install -e ".[trl]"``; about a
minute). OUT_DIR (default ``runs/trl-students``) gets TRL's ``trainer_state.json``, the completions TRL scored
(``completions/*.parquet``), the adapter (``adapter/``) and the rounds that replay every reward (``rounds.json``).
"""

import json
import sys
from pathlib import Path

from agents.models import load_base
from populora_bridges.grpo import SMOKE, StudentRounds, grpo_trainer, save_outputs, smoke_lora
from populora_env import SeedTeacher

out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/trl-students")
model, tokenizer = load_base("tiny-random")
game = StudentRounds([SeedTeacher(seed=0)], num_generations=4, tokenizer=tokenizer, seed=0,
                     task_types=("deduction",), prompts="small", lenient_answer_close=True)

# TRL's GRPOConfig fields of a 2-step CPU run (bridge's SMOKE: 2 prompts x 4 completions of 2 tokens a step)
trainer = grpo_trainer(game, model, tokenizer, out, rounds=8, peft_config=smoke_lora(), **SMOKE)
trainer.train()  # TRL's GRPOTrainer: its generation, its GRPO loss, the env's rewards
print(json.dumps(save_outputs(trainer, game, out), sort_keys=True))
