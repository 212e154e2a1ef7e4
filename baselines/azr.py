"""The compute-matched single-agent Absolute Zero Reasoner (AZR) baseline.

One LoRA adapter (``azr``) plays both roles on the same env: it proposes tasks as ``teacher_0`` and solves
them as ``student_0``. What changes against a PopuLoRA run of the same preset:

- **reward**: the ``azr`` scheme: the proposer is paid the *learnability of its own tasks*,
  r = 1 − p̂ if 0 < p̂ < 1 else 0 (``extreme_reward``), −1 for an invalid task, where p̂ is its own solve
  rate over the ``samples_per_task`` attempts; solver rewards are the same (+1 / −0.5 / −1);
- **no evolution**, one adapter, one optimizer.

What does **not** change: the trainer section. Both arms use the run's advantage estimator; every shipped
preset sets the paper's REINFORCE++-baseline (``reinforce_pp_baseline``: each task's attempts centred on their
mean, a proposal — a group of one — keeps its raw reward, then whitening per member × role × task type with
the role-wide fallback of ``selfplay.rollouts.whitening_scopes``), and ``--trainer.advantage X`` changes it
for either arm alike (``reinforce_pp``, AZR's code's TRR++ without per-task centring, is the ablation).
(Switching the baseline alone to another estimator would confound the comparison: e.g. per-task centring
gives a task solved 8/8 advantage 0, plain whitening gives it a positive one, i.e. it reinforces easy tasks.)

**Equal role weighting.** The single adapter's batch holds ``tasks_per_teacher`` proposals and
``samples_per_task`` times as many attempts; one token mean over it would give the proposer only its share of
the tokens (10-20 %), where AZR trains equal role batches and a population teacher gets all of its own
update. With ``trainer.role_weighting = "balanced"`` (every shipped preset) the loss is the mean of a
proposer term and a solver term, each a token mean over its own role (``agents.weighting``); ``"tokens"``
is the unbalanced ablation. A population member's batch holds one role, so the setting leaves it unchanged.

**Compute matching (per adapter, per role).** Each step the baseline adapter makes exactly one proposer's
budget — ``tasks_per_teacher`` proposals of ``teacher_max_new_tokens`` at most — and exactly one matched
student's budget — ``samples_per_task`` attempts at each of its tasks (its teacher's valid tasks, topped up
with buffer tasks to ``tasks_per_teacher`` when ``student_fill``), ``student_max_new_tokens`` at most — and
takes **one** update per step over both (AZR concatenates its role batches into one step; one update is one
optimizer step with the default ``epochs = 1`` and no mini-batches, and the same trainer section either way).
A population member of the same preset also takes one update per step, over its own role's batch of
the same size (with ``num_teachers == num_students``, every student solves exactly one teacher's tasks). So
per step, per role, the baseline adapter sees the same number of completions and generation-token budget
as one population member; the population as a whole spends ``num_teachers + num_students`` adapters' worth
(the paper's "per-adapter compute-matched" baseline; the total-compute difference is the portfolio effect
its critics point at).

Difference from AZR kept on purpose: AZR does not train on its 8 learnability rollouts and draws a
separate solver batch from the buffer; here the solver's learnability attempts are its training samples,
exactly as a PopuLoRA student's are, so the two arms differ only in who proposes and who judges.
"""

from __future__ import annotations

import dataclasses
import logging

from populora_env.checks import ConfigError
from selfplay.config import TrainConfig
from selfplay.scripted import ScriptedConfig

log = logging.getLogger(__name__)

MEMBER = "azr"


def azr_mapping() -> dict[str, str]:
    """Agent -> adapter: ``teacher_0`` and ``student_0`` both act with the one ``azr`` adapter."""
    return {"teacher_0": MEMBER, "student_0": MEMBER}


def azr_config(cfg: TrainConfig) -> TrainConfig:
    """The baseline's configuration derived from a run configuration: one teacher and one student (one adapter,
    see :func:`azr_mapping`), the ``azr`` reward scheme, no evolution; budgets, token limits and the trainer
    section (estimator included) unchanged; per-role trainer settings (``trainer.teacher.*``) apply to the
    proposer rows, ``trainer.student.*`` to the solver rows. Scripted opponents (``scripted``) are dropped: the
    baseline's opponent is itself.

    Raises:
        ConfigError: a per-role learning rate (the one adapter has one optimizer and one learning rate), or
            per-role loss aggregations that differ under ``role_weighting = "tokens"`` (one token mean over both
            roles has one aggregation).
    """
    trainer = cfg.trainer
    for role in ("teacher", "student"):
        if getattr(trainer, role).lr is not None:
            raise ConfigError(f"trainer.{role}.lr", "the single-agent baseline trains one adapter with one optimizer, "
                              "so its proposer and solver rows share one learning rate: set trainer.lr")
    modes = {trainer.for_role(role).loss_agg_mode for role in ("teacher", "student")}
    if len(modes) > 1 and trainer.role_weighting == "tokens":
        raise ConfigError("trainer.role_weighting", "'tokens' is one token mean over the proposer and solver rows, "
                          "which cannot take two loss aggregations; use 'balanced' or one trainer.loss_agg_mode")
    env = dataclasses.replace(cfg.env, num_teachers=1, num_students=1, reward_scheme="azr")
    if cfg.scripted.active:
        log.warning("the baseline plays itself (one adapter proposes and solves): the scripted section is not used")
    return dataclasses.replace(cfg, env=env, evolution=False, scripted=ScriptedConfig())
