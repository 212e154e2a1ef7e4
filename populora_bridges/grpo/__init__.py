"""TRL's ``GRPOTrainer`` on the game (``pip install -e ".[trl]"``; docs/trl.md).

- :class:`StudentRounds`: the env's solver prompts for tasks proposed by teachers you choose, paid by the env's
  verdicts and reward scheme; a GRPO group is the ``samples_per_task`` attempts at one task.
- :class:`TeacherRounds`: the env's proposer prompts, paid the population reward against frozen students you
  choose (the scheme's teacher reward: 1 − p̂, 0 or −1 under ``populora``).
- :class:`RunMembers`: frozen members of a run directory as policies; :class:`BufferTeacher`: a saved task buffer
  as a teacher.

Each gives ``dataset(rounds)`` (TRL's ``train_dataset``) and ``reward`` (one of TRL's ``reward_funcs``), which
replays the env's rounds with TRL's completions and logs the game's metrics through TRL's ``log_metric``.
This subpackage sits above the run layer (it loads run directories); import it only with the extra installed.
"""

from populora_bridges.grpo.rounds import BufferTeacher, GameRounds, Round, StudentRounds, TeacherRounds

__all__ = ["BufferTeacher", "GameRounds", "Round", "RunMembers", "StudentRounds", "TeacherRounds"]


def __getattr__(name: str):
    if name == "RunMembers":  # the learning stack loads only when a run's members are asked for
        from populora_bridges.grpo.members import RunMembers

        return RunMembers
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
