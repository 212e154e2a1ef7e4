"""Generation engines: actors serving the members' adapters, behind the loop's ``Generator`` interface.

An :class:`Engine` holds one base copy, the adapters of the members it serves (a
:class:`~agents.population.LoRAPopulation` used only for serving) and a generator of
:mod:`agents.generation` over them (``generation.engine``: HF on CPU, vLLM multi-LoRA on GPU), all built by
:func:`selfplay.members.build_members` as the local run builds its own. :class:`RayGenerator` is the driver's
``Generator``:

* ``refresh(names)``: each owning trainer shard puts the members' new states in the object store and hands back
  the refs; the driver passes those refs (never the tensors) to the engines serving the members, which fetch
  them, copy them into their adapters and re-publish them to their generator (``Generator.refresh``: vLLM gives
  every new version a fresh LoRA id). The loop calls it after every update and every PBT replacement.
* ``load_version(name, version, state)`` (an asynchronous run, :mod:`selfplay.pipeline`): the engines serving the
  member serve that state as that version (their generator's ``load_version``); a request naming a version is
  served only by an engine that holds it.
* ``generate(requests)``: with ``ray.engine_adapters='all'`` (every engine serves every member) and the HF
  engine, the driver cuts the batch exactly as :class:`~agents.generation.hf.HFGenerator` does on one machine
  (rows = samples in request order, sorted by prompt length when there are more than ``batch_size``, chunks
  of ``batch_size``) and hands chunks to idle engines. A chunk is generated with the same rows, adapters,
  padding and threads as on one machine, so the samples are bitwise those of ``--backend local`` whichever
  engine makes them. (A sample depends on its chunk's composition through float rounding of the batched
  matmuls and of the mixed-adapter LoRA term; on a small random model 5 of 16 samples changed when the chunk
  lost half its members, so an engine that served only its shard's members could not match the local run.)
  With vLLM, or with ``engine_adapters='shard'`` (engine ``i`` serves the members of shard ``i mod trainers``:
  less adapter memory per engine), requests are routed whole to an engine serving their adapter.

Completions come back as numpy arrays (:mod:`.packing`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from agents.generation.base import Completion, GenerationRequest
from selfplay.distributed.packing import pack_completions, unpack_completions
from selfplay.members import actor_members

__all__ = ["Engine", "RayGenerator", "hf_plan"]


def hf_plan(n_rows: int, prompt_lens: Sequence[int], batch_size: int) -> list[list[int]]:
    """The chunks (lists of row numbers) :meth:`HFGenerator.generate` makes of ``n_rows`` rows with these prompt
    lengths: in order when they fit one batch, else sorted by prompt length (stable) and cut every
    ``batch_size`` rows."""
    if n_rows > batch_size:
        order = sorted(range(n_rows), key=lambda i: prompt_lens[i])
    else:
        order = list(range(n_rows))
    return [order[s:s + batch_size] for s in range(0, n_rows, batch_size)]


class Engine:
    """One generation engine (module docstring)."""

    def __init__(self, cfg_dict: Mapping[str, Any], members: Sequence[str], threads: int) -> None:
        cfg, parts = actor_members(cfg_dict, members, threads, generator=True)
        self.population, self.generator = parts.population, parts.generator
        self.engine = cfg.generation.engine
        self.versions = {m: 0 for m in members}
        self._plan: tuple[int, list, list[list[int]]] | None = None

    def info(self) -> dict[str, Any]:
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "members": self.population.names, "threads": torch.get_num_threads(), "engine": self.engine}

    def load(self, *published: Mapping[str, Any]) -> dict[str, int]:
        """Copy the published states (``name -> ObjectRef`` dicts from the shards) of the members this engine
        serves into its adapters and re-publish them to the backend; returns the members' new versions."""
        refs = {n: r for d in published for n, r in d.items() if n in self.population}
        if not refs:
            return {}
        states = ray.get(list(refs.values()))
        for name, state in zip(refs, states, strict=True):
            self.population.load_state(name, state)
            self.versions[name] += 1
        self.generator.refresh(list(refs))
        return {n: self.versions[n] for n in refs}

    def load_version(self, name: str, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Serve ``state`` as ``version`` of ``name`` (an asynchronous run; the generator's
        ``load_version``, under the lifecycle contract of :mod:`agents.generation.versions`)."""
        self.generator.load_version(name, version, dict(state))

    def state(self, name: str) -> dict[str, torch.Tensor]:
        """The adapter this engine serves for ``name`` (tests compare it with the shard's)."""
        return self.population.state(name)

    def generate_chunks(self, call: int, requests: Sequence[GenerationRequest], chunks: Sequence[int]
                        ) -> dict[str, Any]:
        """Generate chunks ``chunks`` of the HF plan of ``requests`` (plan cached per ``call``); packed
        completions with their row numbers."""
        t0 = time.perf_counter()
        gen = self.generator
        if self._plan is None or self._plan[0] != call:
            rows = gen._rows(requests)  # the HF backend's own rows: seeds, prompt ids, limits
            self._plan = (call, rows, hf_plan(len(rows), [len(r.prompt_ids) for r in rows], gen.batch_size))
        _, rows, plan = self._plan
        done: list[Completion] = []
        numbers: list[int] = []
        for c in chunks:
            done.extend(gen._generate_chunk([rows[i] for i in plan[c]]))
            numbers.extend(plan[c])
        return pack_completions(done, numbers) | {"seconds": time.perf_counter() - t0}

    def generate(self, requests: Sequence[GenerationRequest]) -> dict[str, Any]:
        """The backend's ``generate`` on ``requests``; packed completions."""
        t0 = time.perf_counter()
        return pack_completions(self.generator.generate(list(requests))) | {"seconds": time.perf_counter() - t0}


class RayGenerator:
    """The loop's ``Generator`` over engine actors (module docstring).

    Args:
        engines: :class:`Engine` handles.
        serves: per engine, the members it serves.
        shards: trainer shard handles; ``owner``: member -> shard index (who publishes a member's state).
        engine: the generation engine, ``"hf"`` or ``"vllm"``; ``batch_size``: the HF engine's rows per chunk.
        whole_chunks: cut the batch like the local HF backend and hand out chunks (every engine must serve
            every member).
    """

    def __init__(self, engines: Sequence[Any], serves: Sequence[Sequence[str]], shards: Sequence[Any],
                 owner: Mapping[str, int], engine: str, batch_size: int, whole_chunks: bool) -> None:
        self.engines = list(engines)
        self.serves = [set(s) for s in serves]
        self.shards = list(shards)
        self.owner = dict(owner)
        self.engine = engine
        self.batch_size = int(batch_size)
        self.whole_chunks = bool(whole_chunks) and engine == "hf"
        self._loads: list[Any] = []
        self._call = 0
        self.last_call: dict[str, Any] = {}
        # seconds: driver wall time of generate() (refresh waits included) and the engines' own compute on the
        # critical path (per call, the busiest engine's sum); their difference is what the actors cost
        self.totals = {"calls": 0, "wall_s": 0.0, "compute_s": 0.0}

    def refresh(self, names: Sequence[str] | None = None) -> None:
        """Publish the members' current states from their shards to the engines serving them (refs only)."""
        names = list(self.owner) if names is None else list(names)
        by_shard: dict[int, list[str]] = {}
        for n in names:
            by_shard.setdefault(self.owner[n], []).append(n)
        published = {s: self.shards[s].publish.remote(ns) for s, ns in by_shard.items()}
        for e, engine in enumerate(self.engines):
            refs = [ref for s, ref in published.items() if self.serves[e] & set(by_shard[s])]
            if refs:  # top-level refs: Ray hands the engine the dicts of refs, the tensors stay in the store
                self._loads.append(engine.load.remote(*refs))

    def load_version(self, name: str, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Have every engine serving ``name`` serve ``state`` as ``version`` of it (an asynchronous run: the
        state is put in the object store once; the engines load it before their next call)."""
        ref = ray.put(dict(state))
        for e, engine in enumerate(self.engines):
            if name in self.serves[e]:
                self._loads.append(engine.load_version.remote(name, version, ref))

    def wait_loaded(self) -> None:
        """Block until every pending ``refresh`` reached its engines (raises what an engine raised)."""
        loads, self._loads = self._loads, []
        ray.get(loads)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Completions of every request, ordered by (request, sample), as the local backend returns them."""
        t0 = time.perf_counter()
        requests = list(requests)
        self.wait_loaded()
        if not requests:
            return []
        if any(r.seed is None for r in requests):
            raise ValueError("the Ray generator needs a seed on every request (the loop derives them): an unseeded "
                             "request would draw from a different RNG on each engine")
        self._busy: dict[int, float] = {}
        out = self._generate_chunks(requests) if self.whole_chunks else self._generate_routed(requests)
        self.totals["calls"] += 1
        self.totals["wall_s"] += time.perf_counter() - t0
        self.totals["compute_s"] += max(self._busy.values(), default=0.0)
        return out

    def _generate_chunks(self, requests: list[GenerationRequest]) -> list[Completion]:
        n_rows = sum(r.n for r in requests)
        n_chunks = math.ceil(n_rows / self.batch_size)
        self._call += 1
        req_ref = ray.put(requests)
        todo = list(range(n_chunks))
        idle = list(range(len(self.engines)))
        inflight: dict[Any, int] = {}
        rows: list[Completion | None] = [None] * n_rows
        used: dict[int, int] = {}
        while todo or inflight:
            while idle and todo:
                e = idle.pop(0)
                inflight[self.engines[e].generate_chunks.remote(self._call, req_ref, [todo.pop(0)])] = e
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                e = inflight.pop(ref)
                packed = ray.get(ref)
                self._busy[e] = self._busy.get(e, 0.0) + packed["seconds"]
                for i, c in zip(packed["rows"].tolist(), unpack_completions(packed), strict=True):
                    rows[i] = c
                used[e] = used.get(e, 0) + 1
                idle.append(e)
        self.last_call = {"chunks": n_chunks, "per_engine": used}
        if any(c is None for c in rows):
            raise RuntimeError("an engine returned no completion for some rows")
        return rows  # type: ignore[return-value]

    def _generate_routed(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Requests routed whole: to an engine serving their adapter, spread by rows over those that do."""
        load = [0] * len(self.engines)
        mine: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            able = [e for e in range(len(self.engines)) if r.adapter is None or r.adapter in self.serves[e]]
            if not able:
                raise KeyError(f"request {i} names adapter {r.adapter!r}, which no engine serves")
            e = min(able, key=lambda k: (load[k], k))
            load[e] += r.n
            mine.setdefault(e, []).append(i)
        refs = {e: self.engines[e].generate.remote([requests[i] for i in idx]) for e, idx in mine.items()}
        out: list[Completion] = []
        for e, ref in refs.items():
            packed = ray.get(ref)
            self._busy[e] = packed["seconds"]
            for c in unpack_completions(packed):
                c.request_index = mine[e][c.request_index]
                out.append(c)
        self.last_call = {"per_engine": {e: len(idx) for e, idx in mine.items()},
                          "adapters": {e: sorted({str(requests[i].adapter) for i in idx}) for e, idx in mine.items()}}
        return sorted(out, key=lambda c: (c.request_index, c.sample_index))
