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

from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from agents.models import load_base
from populora_bridges.grpo import StudentRounds
from populora_env import SeedTeacher

out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/trl-students")
model, tokenizer = load_base("tiny-random")
game = StudentRounds([SeedTeacher(seed=0)], num_generations=4, tokenizer=tokenizer, seed=0,
                     task_types=("deduction",), prompts="small", lenient_answer_close=True)

args = GRPOConfig(
    output_dir=str(out), max_steps=2, per_device_train_batch_size=8, num_generations=4,
    max_completion_length=2, learning_rate=5e-3, logging_steps=1, log_completions=True,
    num_completions_to_print=0, report_to=[], use_cpu=True, seed=0, save_strategy="no", bf16=False,
)
trainer = GRPOTrainer(
    model=model, reward_funcs=game.reward, args=args, train_dataset=game.dataset(rounds=8),
    processing_class=tokenizer, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
)
trainer.train()

trainer.save_model(str(out / "adapter"))
trainer.save_state()
game.save(out / "rounds.json")
game.close()
logged = {k: v for row in trainer.state.log_history for k, v in row.items() if k.startswith("game/")}
print(json.dumps({"steps": trainer.state.global_step, "game": logged}, sort_keys=True))
