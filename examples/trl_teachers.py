"""Train a teacher with TRL's GRPOTrainer on the game: the env's proposer prompts, paid the population reward.

``populora_bridges.grpo.TeacherRounds`` draws the env's proposer prompts; its ``reward`` replays each proposal as
a round of the game: the sandbox validates it, the frozen student you choose (here the scripted
``OracleStudent``; frozen run members work the same way, docs/trl.md) attempts the task
``samples_per_task`` times, and the env's reward scheme pays the teacher (``populora``: 1 − p̂ if the student
solves it at least once, 0 if never, −1 if invalid). Validity reasons, p̂ and pair outcomes go to TRL's logs.

The model is ``tiny-random`` (noise), which never writes a valid program: the example's prompt set pre-fills an
induction answer's inputs for the seed program ``f(a) = a`` and leaves the model the message, which the env's
``max_message_chars`` accepts (a valid task: 1 − p̂ = 0 against the oracle) or rejects (``too_long``: −1). That
is enough reward variance for GRPO to move the LoRA adapter in 2 steps on CPU.

Run it: ``.venv/bin/python examples/trl_teachers.py [OUT_DIR]`` (needs ``pip install -e ".[trl]"``; about a
minute). OUT_DIR (default ``runs/trl-teachers``) holds what ``examples/trl_students.py`` writes.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

from agents.models import load_base
from populora_bridges.grpo import SMOKE, TeacherRounds, grpo_trainer, save_outputs, smoke_lora
from populora_env import OracleStudent, get_prompt_set

out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/trl-teachers")
model, tokenizer = load_base("tiny-random")
small = get_prompt_set("small")  # its induction prefix opens the first input block: fill the inputs too
prompts = replace(small, prefix_propose_induction=small.prefix_propose_induction
                  + "1\n```\n```input\n2\n```\n```message\n")
game = TeacherRounds([OracleStudent], num_generations=4, tokenizer=tokenizer, seed=0, task_types=("induction",),
                     hand_seeds="identity", induction_inputs=2, max_message_chars=10, samples_per_task=2,
                     prompts=prompts, lenient_answer_close=True)

# TRL's GRPOConfig fields of a 2-step CPU run (bridge's SMOKE: 2 prompts x 4 completions of 2 tokens a step)
trainer = grpo_trainer(game, model, tokenizer, out, rounds=8, peft_config=smoke_lora(), **SMOKE)
trainer.train()  # TRL's GRPOTrainer: its generation, its GRPO loss, the env's rewards
print(json.dumps(save_outputs(trainer, game, out), sort_keys=True))
