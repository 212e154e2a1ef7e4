"""The shipped seed tasks: outputs re-verified in the sandbox, and every seed is a valid proposal."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from populora_env.literals import parse_call_args
from populora_env.seeds import (
    ARG_GENERATORS,
    SEED_PROGRAMS,
    generate_args,
    seed_tasks,
    strip_comments_and_docstrings,
)
from populora_env.tasks import TaskType
from populora_env.validation import ProposalRequest, ProposalValidator, ValidationConfig, execution_jobs

from .helpers import think


def test_a_dozen_seeds_starting_with_azr_identity() -> None:
    assert len(SEED_PROGRAMS) >= 12
    identity = SEED_PROGRAMS[0]
    assert identity.program == "def f(a):\n    return a\n"
    assert identity.inputs[0] == identity.outputs[0] == "'Hello world'"
    for seed in SEED_PROGRAMS:
        assert len(seed.inputs) == len(seed.outputs) == 10 and len(set(seed.inputs)) == 10


def test_stored_outputs_match_the_sandbox(sandbox: Any) -> None:
    jobs, expected = [], []
    for seed in SEED_PROGRAMS:
        for given, output in zip(seed.inputs, seed.outputs, strict=True):
            jobs.extend(execution_jobs(seed.program, given, None))
            expected.append(output)
    results = sandbox.run(jobs)
    for k, output in enumerate(expected):
        first, second = results[2 * k], results[2 * k + 1]
        assert first.status == second.status == "ok", (first, second)
        assert first.value == second.value == output


def test_seeds_with_generated_inputs_are_valid_proposals(sandbox: Any) -> None:
    rng = np.random.default_rng(0)
    requests, completions = [], []
    for k, seed in enumerate(SEED_PROGRAMS):
        given = generate_args(seed.arg_kinds, rng)
        parse_call_args(given)
        requests.append(ProposalRequest("t", k, TaskType.ABDUCTION, f"t{k}", 0))
        completions.append(think(f"```python\n{seed.program}```\n```input\n{given}\n```"))
    outs = ProposalValidator(ValidationConfig()).validate(requests, completions, sandbox)
    assert all(o.valid for o in outs), [(o.reason, o.detail) for o in outs if not o.valid]


def test_every_generator_is_used_and_yields_literals() -> None:
    used = {kind for seed in SEED_PROGRAMS for kind in seed.arg_kinds}
    assert used == set(ARG_GENERATORS)
    rng = np.random.default_rng(1)
    for kind in ARG_GENERATORS:
        parse_call_args(generate_args((kind,), rng))



@settings(max_examples=60, deadline=None)
@hgiven(program=st.sampled_from([p.program for p in SEED_PROGRAMS]),
       comment=st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=20),
       docstring=st.booleans())
def test_stripping_keeps_the_program_and_drops_comments_and_docstrings(program: str, comment: str,
                                                                        docstring: bool) -> None:
    import ast

    lines = program.splitlines()
    commented = "\n".join(f"{line}  # {comment}" for line in lines) + "\n"
    if docstring:
        commented = commented.replace("):\n", '):\n    """Docstring with # inside."""\n', 1)
    out = strip_comments_and_docstrings(commented)
    assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(program))
    assert "Docstring" not in out and (not comment.strip() or f"# {comment}" not in out)


@hgiven(st.text(max_size=200))
def test_stripping_never_raises_on_model_text(text: str) -> None:
    assert isinstance(strip_comments_and_docstrings(text), str)


def test_identity_hand_seeds_keep_only_the_zero_triplet() -> None:
    tasks = seed_tasks(6, "identity")
    assert [t.task_id for t in tasks] == ["seed-deduction-0", "seed-abduction-0", "seed-induction-0"]
    assert all(t.program == SEED_PROGRAMS[0].program for t in tasks)
