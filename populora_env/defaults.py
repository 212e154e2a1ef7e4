"""The game's defaults that more than one config holds, declared once.

:class:`~populora_env.config.EnvConfig` (the env's settings), :class:`~populora_env.validation.ValidationConfig`
(the proposal validator's) and :class:`~populora_env.checking.CheckConfig` (the answer checker's) share these
fields. The validator and the checker cannot import ``EnvConfig`` (it imports the prompt sets, which import the
validator), so the values live here, below all three, and each config's default names them. The meaning of
each field is documented on ``EnvConfig``.
"""

from __future__ import annotations

__all__ = [
    "INDUCTION_INPUTS",
    "LENIENT_ANSWER_CLOSE",
    "MAX_INPUT_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_OUTPUT_CHARS",
    "MAX_PROGRAM_CHARS",
    "REJECT_DUPLICATES",
    "REQUIRE_THINK",
    "VALIDATION_PROFILE",
    "VALIDATION_PROFILES",
]

MAX_PROGRAM_CHARS = 4000
MAX_INPUT_CHARS = 1000
MAX_MESSAGE_CHARS = 1000
MAX_OUTPUT_CHARS = 1000
INDUCTION_INPUTS = 6
REJECT_DUPLICATES = True
REQUIRE_THINK = True
LENIENT_ANSWER_CLOSE = False
VALIDATION_PROFILES: tuple[str, ...] = ("strict", "azr")
"""Validation profiles of proposals (the rules of each are in :mod:`populora_env.validation`)."""
VALIDATION_PROFILE = "strict"
