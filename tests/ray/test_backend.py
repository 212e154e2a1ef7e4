"""The Ray backend's parts in this process: engines generate bitwise what the local HF engine generates (chunks
spread over both engines), new states reach the engines only through ``refresh``, the sync metric tells a
stale engine from a synced one, and an option added to the run's builder reaches every actor."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from agents.generation import GenerationRequest, HFGenerator
from agents.models import load_base
from agents.population import LoRAPopulation, randomize_member
from agents.rollout import Rollout
from agents.trainer import TrainerConfig
from populora_env.config import EnvConfig
from populora_env.env import agent_names
from selfplay.config import TrainConfig
from selfplay.distributed.config import RayConfig
from selfplay.mapping import AgentMapping
from tests.selfplay.conftest import REPO

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

CFG = TrainConfig(
    model="tiny-random", rank=4, alpha=8, threads=1, seed=3, backend="ray",
    env=EnvConfig(num_teachers=2, num_students=2),
    trainer=TrainerConfig(lr=0.05, entropy_coef=0.05),
    ray=RayConfig(trainers=2, engines=2, sandbox_nodes=1, sandbox_workers_per_node=1, sync_rollouts=8,
                  placement_timeout_s=600),
)
CFG = dataclasses.replace(CFG, generation=dataclasses.replace(CFG.generation, batch_size=3, threads=1))


# adds an option to selfplay.members.build_members in every process that imports it (the actors do, with the run's
# plugins); it changes no part, so the tests below see the plain backend
PLUGIN = str(REPO / "tests" / "selfplay" / "builder_plugin.py")


@pytest.fixture(scope="module")
def parts(ray_cluster, tmp_path_factory):
    from selfplay.distributed.backend import RayBackend

    run_dir = tmp_path_factory.mktemp("backend")
    backend = RayBackend(dataclasses.replace(CFG, plugins=(PLUGIN,), run_dir=run_dir), run_dir)
    teachers, students = agent_names(2, 2)
    mapping = AgentMapping.build(teachers, students, None)
    try:
        population, generator, trainer = backend.build(mapping)
        yield backend, mapping, population, generator, trainer
    finally:
        backend.close()


def _local(members):
    torch.manual_seed(CFG.seed)
    base, tok = load_base("tiny-random", dtype=torch.float32)
    return LoRAPopulation(base, members, rank=CFG.rank, alpha=CFG.alpha, seed=CFG.seed), tok


def _requests(members):
    adapters = [*members, None]
    return [GenerationRequest(adapters[i % len(adapters)], f"task {i}: " + "x " * (i % 4), max_new_tokens=6,
                              temperature=1.0, top_p=0.95, n=1 + i % 2, seed=100 + i) for i in range(10)]


def test_engines_generate_bitwise_the_local_backend(parts):
    backend, mapping, population, generator, _trainer = parts
    members = mapping.members
    local, tok = _local(members)
    for m in members:  # non-zero adapters, written into the shards, published to the engines by refresh only
        randomize_member(local, m, std=0.3, seed=11)
        population.load_state(m, local.state(m))
    generator.refresh(members)
    reqs = _requests(members)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = HFGenerator(local, tok, batch_size=3).generate(reqs)
    finally:
        torch.set_num_threads(threads)
    got = generator.generate(reqs)
    assert len(got) == len(want) == 15
    for a, b in zip(want, got, strict=True):
        assert (a.request_index, a.sample_index, a.adapter) == (b.request_index, b.sample_index, b.adapter)
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.text == b.text
        assert a.prompt_token_ids == b.prompt_token_ids and a.finish_reason == b.finish_reason
    assert generator.last_call["chunks"] == 5 and len(generator.last_call["per_engine"]) == 2, generator.last_call
    for e in backend.engines:  # each engine serves exactly the shards' states
        for m in members:
            s, t = ray.get(e.state.remote(m)), population.state(m)
            assert all(torch.equal(s[k], t[k]) for k in t)
    with pytest.raises(ValueError, match="seed"):
        generator.generate([GenerationRequest(members[0], "x", seed=None)])


def _rollouts(completions):
    return [Rollout(c.prompt_token_ids, c.token_ids, 0.0, group=i, logprobs=c.logprobs)
            for i, c in enumerate(completions)]


def test_sync_metric_tells_a_stale_engine(parts):
    _backend, mapping, _population, generator, trainer = parts
    m = mapping.members[0]
    reqs = [GenerationRequest(m, f"prompt {i}", max_new_tokens=8, temperature=1.0, seed=i) for i in range(4)]
    synced = trainer.update_many({m: _rollouts(generator.generate(reqs))})[m]["sync"]
    # the update changed the shard's weights; without refresh the engine keeps serving the old ones
    stale = trainer.update_many({m: _rollouts(generator.generate(reqs))})[m]["sync"]
    generator.refresh([m])
    again = trainer.update_many({m: _rollouts(generator.generate(reqs))})[m]["sync"]
    assert synced < 1e-4 and again < 1e-4, (synced, again)
    assert stale > 100 * max(synced, again, 1e-7) and stale > 1e-3, (synced, stale, again)


def test_shard_mode_routes_requests_to_the_engine_of_their_shard(parts):
    """engine_adapters=shard: each request goes whole to the engine serving its member (base requests to any);
    samples are the local ones up to the float rounding of a different batch composition."""
    from selfplay.distributed.cluster import split_members
    from selfplay.distributed.engines import RayGenerator

    backend, mapping, _population, generator, _trainer = parts
    groups = split_members(mapping.members, mapping.roles, 2)
    routed = RayGenerator(backend.engines, groups, backend.shards, generator.owner, "hf", 3, whole_chunks=False)
    reqs = _requests(mapping.members)
    got = routed.generate(reqs)
    want = generator.generate(reqs)  # whole chunks: the local backend's samples
    assert [(c.request_index, c.sample_index, c.adapter) for c in got] == \
        [(c.request_index, c.sample_index, c.adapter) for c in want]
    adapters = routed.last_call["adapters"]
    assert sorted(adapters) == [0, 1], routed.last_call
    for e in (0, 1):
        assert set(adapters[e]) <= {*groups[e], "None"} and set(groups[e]) <= set(adapters[e]), adapters
    for a, b in zip(want, got, strict=True):  # equal up to the first token a rounding difference flipped
        assert a.prompt_token_ids == b.prompt_token_ids
        k = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y),
                 min(len(a.token_ids), len(b.token_ids)))
        assert all(abs(x - y) < 1e-3 for x, y in zip(a.logprobs[:k], b.logprobs[:k], strict=True))
    with pytest.raises(KeyError, match="no engine serves"):
        RayGenerator(backend.engines, [groups[0], groups[0]], backend.shards, generator.owner, "hf", 3,
                     whole_chunks=False).generate([GenerationRequest(groups[1][0], "x", seed=1)])


def test_an_option_added_to_the_builder_reaches_every_actor(parts):
    """The plugin adds an option to ``selfplay.members.build_members`` and edits nothing else: each trainer shard
    built its members' trainer with it, each engine its generator, in the actors' own processes (the local run
    gets it the same way: tests/selfplay/test_parts.py)."""
    backend, mapping, _population, _generator, _trainer = parts
    run_dir = backend.cfg.run_dir
    lines = [json.loads(x) for x in (run_dir / "builder_option.jsonl").read_text().splitlines()]
    option = {"seed": CFG.seed, "batch_size": CFG.generation.batch_size}
    shards = [ln for ln in lines if "trainer" in ln["parts"]]
    engines = [ln for ln in lines if "generator" in ln["parts"]]
    assert len(lines) == 4 and len(shards) == len(engines) == 2, lines
    assert all(ln["parts"] == {"trainer": option} for ln in shards)
    assert all(ln["parts"] == {"generator": option} for ln in engines)
    assert sorted(m for ln in shards for m in ln["members"]) == sorted(mapping.members)
    assert all(ln["members"] == mapping.members for ln in engines)  # engine_adapters='all'
    pids = {ln["pid"] for ln in lines}
    assert len(pids) == 4 and os.getpid() not in pids
    assert {info["pid"] for info in [*backend.shard_info, *backend.engine_info]} == pids
