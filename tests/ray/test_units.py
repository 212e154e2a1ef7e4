"""The pieces of the Ray backend that need no cluster: the shard split, resource fitting, the visibility
verdict, the wire format, the generation plan and the config checks."""

from __future__ import annotations

import dataclasses

import pytest

from agents.generation.base import Completion
from agents.rollout import Rollout
from populora_env.config import ConfigError
from selfplay.config import TrainConfig
from selfplay.distributed.cluster import fit_demands, split_members, visibility_problems
from selfplay.distributed.config import RayConfig

pytestmark = pytest.mark.ray


def test_members_are_split_with_teachers_and_students_mixed():
    roles = {"teacher": ["t0", "t1", "t2"], "student": ["s0", "s1", "s2", "s3"]}
    members = ["t0", "t1", "t2", "s0", "s1", "s2", "s3"]
    # role by role (students, then teachers), each member to the next shard in turn; the count carries over
    assert split_members(members, roles, 2) == [["t0", "t2", "s0", "s2"], ["t1", "s1", "s3"]]
    two = split_members(["t0", "t1", "s0", "s1"], {"teacher": ["t0", "t1"], "student": ["s0", "s1"]}, 2)
    assert two == [["t0", "s0"], ["t1", "s1"]]
    for groups in (two, split_members(members, roles, 3)):
        assert sorted(m for g in groups for m in g) == sorted({m for g in groups for m in g})  # each member once
    # the baseline: one member in both roles
    assert split_members(["azr"], {"teacher": ["azr"], "student": ["azr"]}, 1) == [["azr"]]
    with pytest.raises(ValueError, match="no member"):
        split_members(["azr"], {"teacher": ["azr"], "student": ["azr"]}, 2)
    # members keep their global order inside a shard
    for g in split_members(members, roles, 3):
        assert g == [m for m in members if m in g]


def test_fit_demands():
    node = {"CPU": 4.0, "GPU": 0.0}
    one = {"CPU": 1.0, "GPU": 0.0}
    assert fit_demands([node] * 3, [one] * 4, [{"CPU": 2.0}] * 3) is None
    assert "no node has that much" in fit_demands([node] * 3, [{"CPU": 1.0, "GPU": 1.0}])
    assert "no node has that much" in fit_demands([node] * 3, [{"CPU": 8.0}])
    assert "do not fit" in fit_demands([node] * 3, [{"CPU": 3.0}] * 5)
    assert "5 sandbox nodes asked for" in fit_demands([node] * 3, [], [{"CPU": 1.0}] * 5)
    gpu = {"CPU": 8.0, "GPU": 2.0}
    assert fit_demands([gpu, gpu], [{"CPU": 1.0, "GPU": 1.0}] * 4) is None
    assert "do not fit" in fit_demands([gpu, gpu], [{"CPU": 1.0, "GPU": 1.0}] * 5)
    # spread bundles take distinct nodes: 2 x 3 CPUs cannot share the one roomy node
    assert "distinct nodes" in fit_demands([{"CPU": 8.0}, {"CPU": 1.0}], [], [{"CPU": 3.0}] * 2)


def test_visibility_verdict():
    assert visibility_problems("tok", {"a": (True, "tok"), "b": (True, "tok")}) == []
    assert visibility_problems("tok", {"a": (True, "tok"), "b": (False, ""), "c": (True, "old")}) == ["b", "c"]


def test_rollouts_and_completions_survive_the_wire_exactly():
    from selfplay.distributed.packing import (
        pack_completions,
        pack_rollouts,
        unpack_completions,
        unpack_rollouts,
    )

    rollouts = [
        Rollout([1, 2, 3], [4, 5], 0.1 + 0.2, group=("student_0", "t1"), scope=("student", "deduction"),
                logprobs=[-0.5, -1.0000000000000002], meta={"role": "student", "matched": True}),
        Rollout([7], [], -1.0, group=("student_0", "t1"), scope=None, logprobs=None, meta={}),
        Rollout([9, 9], [8], 1, group=None, scope=("teacher", "any"), logprobs=[-3.25], meta={"role": "teacher"}),
        Rollout([2], [3], 0.5, logprobs=[-0.25], version=7),  # an asynchronous run's: the version travels too
    ]
    back = unpack_rollouts(pack_rollouts(rollouts))
    assert back == rollouts
    assert [type(r.reward) for r in back] == [float] * 4 and back[0].reward == 0.1 + 0.2
    assert [r.version for r in back] == [None, None, None, 7]
    assert unpack_rollouts(pack_rollouts([])) == []
    comps = [
        Completion(0, 0, "m0", "hi <answer>", [1, 2], [3, 4], [-0.1, -2.5], "stop", {"seed": 7, "stop": "</a>"}),
        Completion(0, 1, "m0", "", [1, 2], [], [], "length", {}),
        Completion(3, 0, None, "x", [5], [6], [-9.75], "length", {"seed": 8}),
        Completion(4, 0, "m1", "y", [5], [6], [-1.5], "stop", {}, version=0),
    ]
    packed = pack_completions(comps, rows=[2, 0, 1, 3])
    assert packed["rows"].tolist() == [2, 0, 1, 3]
    assert unpack_completions(packed) == comps


def test_generation_plan_is_the_hf_backends():
    """hf_plan cuts rows as HFGenerator.generate does: the same chunks of rows, in the same order."""
    pytest.importorskip("ray")
    import torch

    from agents.generation import GenerationRequest, HFGenerator
    from agents.models import load_base
    from agents.population import LoRAPopulation
    from selfplay.distributed.engines import hf_plan

    base, tok = load_base("tiny-random", dtype=torch.float32)
    pop = LoRAPopulation(base, ["m0", "m1"], rank=2, alpha=4)
    gen = HFGenerator(pop, tok, batch_size=3)
    seen: list[list[int]] = []
    real = gen._generate_chunk

    def spy(rows):
        seen.append([(r.request_index, r.sample_index) for r in rows])
        return real(rows)

    gen._generate_chunk = spy
    reqs = [GenerationRequest("m0" if i % 2 else "m1", "x " * (7 - i), max_new_tokens=2, n=1 + i % 2, seed=i)
            for i in range(6)]
    gen.generate(reqs)
    rows = gen._rows(reqs)
    plan = hf_plan(len(rows), [len(r.prompt_ids) for r in rows], 3)
    assert [[(rows[i].request_index, rows[i].sample_index) for i in c] for c in plan] == seen
    assert len(seen) == 3


def test_ray_section_checks():
    rc = RayConfig()
    rc.validate()
    rc.validate(4)
    for field, value, needle in [("trainers", 0, "ray.trainers"), ("engines", 0, "ray.engines"),
                                 ("sandbox_workers_per_node", 0, "ray.sandbox_workers_per_node"),
                                 ("trainer_cpus", 0.0, "ray.trainer_cpus"), ("sync_rollouts", 0, "ray.sync_rollouts"),
                                 ("engine_adapters", "some", "ray.engine_adapters"),
                                 ("sandbox_require", "weak", "ray.sandbox_require")]:
        with pytest.raises(ConfigError) as e:  # the section names its own fields; the run config adds "ray."
            dataclasses.replace(rc, **{field: value}).validate()
        assert "ray." + e.value.field == needle
    dataclasses.replace(rc, trainers=5).validate()
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(rc, trainers=5).validate(4)
    assert e.value.field == "trainers" and "every shard needs a member" in e.value.reason
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(rc, trainers=2, engines=1, engine_adapters="shard").validate(4)
    assert e.value.field == "engines"
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(TrainConfig(model="tiny-random"), backend="cluster").validate()
    assert e.value.field == "backend"
