"""PopuLoRA-Env: the teacher/student coding game as a PettingZoo parallel environment.

This package (the game) never imports torch: it works with any learning framework.

    from populora_env import parallel_env
    env = parallel_env(num_teachers=4, num_students=4)
    obs, infos = env.reset(seed=0)

Also registered as ``pettingzoo.make("parallel", "populora/PopuLoRA-v0", **kwargs)``.
"""

from populora_env.config import ConfigError, EnvConfig
from populora_env.env import PopuLoRAParallelEnv, agent_names, env, parallel_env, raw_env
from populora_env.matching import Ratings, TrueSkillConfig
from populora_env.metrics import CoverageTracker, program_fingerprint, program_metrics
from populora_env.policies import NoisyStudent, OracleStudent, RandomPolicy, SeedTeacher
from populora_env.prompts import (
    PromptTemplates,
    get_prompt_set,
    list_prompt_sets,
    register_prompt_set,
    unregister_prompt_set,
)
from populora_env.results import (
    AttemptResult,
    CompletionText,
    MatchResult,
    ProposalResult,
    RoundOutcome,
    RoundResults,
)
from populora_env.rewards import (
    RewardScheme,
    SchemeRewards,
    get_reward_scheme,
    list_reward_schemes,
    register_reward_scheme,
    student_reward,
    unregister_reward_scheme,
)
from populora_env.tasks import Task, TaskType
from populora_env.validation import Reason

ENV_ID = "populora/PopuLoRA-v0"

try:  # PettingZoo >= 1.27 registry; older versions have no register()
    import pettingzoo as _pz

    if ENV_ID not in _pz.parallel_registry:
        _pz.register("parallel", ENV_ID, entry_point="populora_env.env:PopuLoRAParallelEnv")
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed PettingZoo
    pass

__all__ = [
    "ENV_ID",
    "AttemptResult",
    "ConfigError",
    "EnvConfig",
    "CoverageTracker",
    "MatchResult",
    "OracleStudent",
    "NoisyStudent",
    "PopuLoRAParallelEnv",
    "PromptTemplates",
    "ProposalResult",
    "RandomPolicy",
    "Ratings",
    "Reason",
    "RewardScheme",
    "RoundOutcome",
    "RoundResults",
    "CompletionText",
    "SeedTeacher",
    "Task",
    "TaskType",
    "TrueSkillConfig",
    "agent_names",
    "env",
    "get_prompt_set",
    "get_reward_scheme",
    "list_prompt_sets",
    "list_reward_schemes",
    "parallel_env",
    "program_fingerprint",
    "program_metrics",
    "raw_env",
    "register_prompt_set",
    "register_reward_scheme",
    "SchemeRewards",
    "student_reward",
    "unregister_prompt_set",
    "unregister_reward_scheme",
]
