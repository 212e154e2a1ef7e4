"""How often a model's proposals and answers pass the env's checks, per prompt variant, task type and role.

    python benchmarks/format_rates.py [--variants chat,small,...] [--n-per-type 16] [--model smollm2-135m]
        [--teacher-tokens 160] [--student-tokens 96] [--temperature 0.8] [--top-p 0.95] [--batch-size 24]
        [--threads 1] [--types deduction,abduction,induction] [--seed 0] [--out DIR]

The model generates as the self-play loop runs it: through :class:`agents.generation.HFGenerator`, the base
with adapters off (a fresh population's zero-initialised adapters act the same), sampling at ``--temperature``
/ ``--top-p``, each request built from the env's own request info (chat template or not, response prefix, stop
strings). The env's own parsing, validation and answer checking decide: for every variant and task type, one
env round with ``--n-per-type`` proposer prompts of that type (4 teachers), then the students' solver prompts
the env emits (matched valid proposals, topped up with buffer tasks: at least ``--n-per-type`` attempts).

Per variant, task type and role it reports: ``n``, formatted % (the ``<think>``/``<answer>`` structure and the
required blocks), valid % (teachers: the proposal became a task) or correct % (students), truncated % (cut at
the token limit), and the median / 90th percentile of completion tokens of the formatted completions (to size
token limits). Variants are the registered prompt sets plus the experimental ones defined below (what the
choice of the ``small`` set rests on). Identical requests (same prompt, prefix, seed...) are generated once
and shared between variants, e.g. a set measured with and without the leniency for a missing ``</answer>``.

Writes ``rates.json`` (every row, and a few completions per row) and ``rates.md`` (the table) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from agents.generation import Completion, GenerationRequest, HFGenerator  # noqa: E402
from agents.models import load_base  # noqa: E402
from agents.population import LoRAPopulation  # noqa: E402
from populora_env import PromptTemplates, get_prompt_set, parallel_env  # noqa: E402
from populora_env.config import TASK_TYPES as TYPES  # noqa: E402
from populora_env.prompts import LITERAL_RULE  # noqa: E402
from populora_env.sandbox import Limits, Sandbox  # noqa: E402

_OPEN = "<think></think>\n<answer>\n"


@dataclass(frozen=True)
class Variant:
    """A prompt set and the env settings it is measured with."""

    templates: PromptTemplates
    lenient: bool = False
    note: str = ""


#: The answer openings of issue 13's measurement (program first in proposals): pre-filled after the assistant turn.
ISSUE_OPENINGS = {
    "propose_deduction": _OPEN + "```python\ndef f(", "propose_abduction": _OPEN + "```python\ndef f(",
    "propose_induction": _OPEN + "```input\n", "solve_deduction": _OPEN + "```output\n",
    "solve_abduction": _OPEN + "```input\n", "solve_induction": _OPEN + "```python\ndef f(",
}
_EXAMPLE = "```python\ndef f(nums, k):\n    return [x * k for x in nums if x > 0]\n```\n"


def _with_openings(templates: PromptTemplates) -> PromptTemplates:
    """``templates`` with :data:`ISSUE_OPENINGS`."""
    return replace(templates, **{f"prefix_{k}": v for k, v in ISSUE_OPENINGS.items()})


def _chat_examples() -> PromptTemplates:
    """The ``chat`` prompts with one worked example each (placeholder text kept), as in issue 13's table."""
    chat = get_prompt_set("chat")
    return replace(
        chat,
        propose_deduction=chat.propose_deduction + "\nExample: <think>double the positives</think><answer>\n"
        + _EXAMPLE + "```input\n[3, -1, 4], 2\n```\n</answer>",
        propose_abduction=chat.propose_abduction + "\nExample: <think>double the positives</think><answer>\n"
        + _EXAMPLE + "```input\n[3, -1, 4], 2\n```\n</answer>",
        propose_induction=chat.propose_induction + "\nExample: <think>small and large</think><answer>\n"
        "```input\n1, 2\n```\n```input\n-5, 7\n```\n```message\nadds the two numbers\n```\n</answer>",
        solve_deduction=chat.solve_deduction + "\nExample: <think>3*2, 4*2</think><answer>\n```output\n[6, 8]\n"
        "```\n</answer>",
        solve_abduction=chat.solve_abduction + "\nExample: <think>try 3 and 4</think><answer>\n```input\n"
        "[3, -1, 4], 2\n```\n</answer>",
        solve_induction=chat.solve_induction + "\nExample: <think>doubles positives</think><answer>\n" + _EXAMPLE
        + "</answer>",
    )


def _small_v1() -> PromptTemplates:
    """The first draft of ``small``: program first in proposals (opening ``def f(``), the full literal rule,
    a worked example with concrete values in every prompt, references in the answer's layout."""
    small = get_prompt_set("small")
    proposer = (
        "Write a new Python function `f` and one input for it. <task> `f` takes at least one argument and "
        "returns a value; no imports, randomness, printing or input(). " + LITERAL_RULE + "\n"
        "Example answer:\n<answer>\n" + _EXAMPLE
        + "```input\n[3, -1, 4], 2\n```\n</answer>\n{references}\nNow write a different function `f` and its input."
    )
    return replace(
        _with_openings(small),
        propose_deduction=proposer.replace(
            "<task>", "Another model will see `f` and the input and must predict what `f` returns."),
        propose_abduction=proposer.replace(
            "<task>", "Another model will see `f` and what it returns, and must find an input that gives it."),
        propose_induction=(
            "Here is a Python function:\n```python\n{program}```\n"
            "Write {n_inputs} different inputs for `f`, each in its own ```input block, then a ```message block "
            "saying in a few words what `f` does. " + LITERAL_RULE + "\n"
            "Example answer for `def f(a, b): return a + b` with 3 inputs:\n<answer>\n"
            "```input\n1, 2\n```\n```input\n-5, 7\n```\n```input\n10, 0\n```\n"
            "```message\nadds the two numbers\n```\n</answer>"
        ),
        reference="Another example:\n```python\n{program}```\n```input\n{input}\n```",
    )


def _small_noex() -> PromptTemplates:
    """``small`` with solver prompts that describe the answer without a worked answer to copy."""
    return replace(
        get_prompt_set("small"),
        solve_deduction=(
            "What does `f` return for this input?\n```python\n{program}```\n```input\n{input}\n```\n"
            "Answer with the returned value, as a Python literal, in an ```output block."
        ),
        solve_abduction=(
            "Find an input for which `f` returns this output.\n```python\n{program}```\n```output\n{output}\n```\n"
            "Answer with the arguments of `f` (Python literals separated by commas) in an ```input block."
        ),
        solve_induction=(
            "Write a Python function `f` that returns these outputs for these inputs.\n{pairs}\n"
            "Hint: {message}\nAnswer with the function in a ```python block."
        ),
    )


def _small_unary() -> PromptTemplates:
    """``small`` with one-argument worked examples (``def f(nums)`` / ``[3, -1, 4]``) in place of the two-argument
    ones, to test whether ``small``'s ``error`` rejections are arity slips copied from the example (measured: not
    measurably, docs/prompts.md §5)."""
    small = get_prompt_set("small")
    fields = ("propose_deduction", "propose_abduction", "solve_abduction", "solve_induction")
    swaps = (("def f(nums, k):\n    return [x * k for x in nums if x > 0]", "def f(nums):\n    return [x * 2 for x "
              "in nums if x > 0]"), ("[3, -1, 4], 2", "[3, -1, 4]"))

    def swap(text: str) -> str:
        for old, new in swaps:
            text = text.replace(old, new)
        return text

    return replace(small, **{k: swap(getattr(small, k)) for k in fields})


def variants() -> dict[str, Variant]:
    """Every measurable variant by name (registered sets first)."""
    out = {
        "chat": Variant(get_prompt_set("chat"), note="registered: today's short chat prompts"),
        "r1": Variant(get_prompt_set("r1"), note="registered: chat prompts in the R1 wrapper, raw"),
        "azr": Variant(get_prompt_set("azr"), note="registered: AZR's prompts in the R1 wrapper, raw"),
        "small": Variant(get_prompt_set("small"), note="registered, strict: final </answer> required"),
        "small+lenient": Variant(get_prompt_set("small"), lenient=True,
                                 note="registered, with lenient_answer_close (missing </answer> accepted)"),
        "chat+examples": Variant(_chat_examples(), note="chat + one worked example per prompt"),
        "chat+open": Variant(_with_openings(get_prompt_set("chat")), note="chat + per-kind answer openings"),
        "chat+examples+open": Variant(_with_openings(_chat_examples()),
                                      note="chat + worked example + per-kind openings (issue 13's best)"),
        "chat+examples+open+lenient": Variant(_with_openings(_chat_examples()), lenient=True,
                                              note="issue 13's best, lenient_answer_close"),
        "small-v1": Variant(_small_v1(), note="first draft of small: program first, examples everywhere"),
        "small-v1+lenient": Variant(_small_v1(), lenient=True, note="first draft, lenient_answer_close"),
        "small-noex": Variant(_small_noex(), note="small without worked answers in solver prompts"),
        "small-noex+lenient": Variant(_small_noex(), lenient=True, note="small-noex, lenient_answer_close"),
        "small-unary+lenient": Variant(_small_unary(), lenient=True,
                                       note="small with one-argument worked examples, lenient_answer_close"),
    }
    for v in out.values():
        v.templates.validate()
    return out


@dataclass
class Row:
    """Counts of one (variant, task type, role)."""

    n: int = 0
    formatted: int = 0
    passed: int = 0  # valid (teachers) or correct (students)
    truncated: int = 0
    tokens_formatted: list[int] = field(default_factory=list)
    tokens_all: list[int] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    def add(self, completion: Completion, formatted: bool, passed: bool, reason: str | None, prefix: str) -> None:
        self.n += 1
        self.formatted += formatted
        self.passed += passed
        self.truncated += completion.finish_reason == "length"
        self.tokens_all.append(len(completion.token_ids))
        if formatted:
            self.tokens_formatted.append(len(completion.token_ids))
        if reason:
            self.reasons[reason] += 1
        if len(self.samples) < 4:
            self.samples.append(prefix + completion.text)

    def summary(self) -> dict[str, Any]:
        def pct(k: int) -> float:
            return round(100.0 * k / self.n, 1) if self.n else 0.0

        def q(values: list[int], p: float) -> int | None:
            return int(np.percentile(values, p)) if values else None

        return {
            "n": self.n, "formatted_pct": pct(self.formatted), "passed_pct": pct(self.passed),
            "truncated_pct": pct(self.truncated),
            "tokens_formatted_median": q(self.tokens_formatted, 50), "tokens_formatted_p90": q(self.tokens_formatted, 90),
            "tokens_all_median": q(self.tokens_all, 50), "reasons": dict(self.reasons.most_common()),
            "samples": self.samples,
        }


class CachedGenerator:
    """Generates each distinct request once (identical requests across variants share their samples)."""

    def __init__(self, generator: HFGenerator) -> None:
        self.generator = generator
        self.cache: dict[tuple, Completion] = {}
        self.generated_tokens = 0
        self.seconds = 0.0

    @staticmethod
    def key(r: GenerationRequest) -> tuple:
        return (r.prompt, r.chat, r.prefix, r.stop, r.max_new_tokens, r.temperature, r.top_p, r.seed)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        todo = [r for r in dict.fromkeys(self.key(r) for r in requests) if r not in self.cache]
        by_key = {self.key(r): r for r in requests}
        if todo:
            t0 = time.perf_counter()
            fresh = self.generator.generate([by_key[k] for k in todo])
            seconds = time.perf_counter() - t0
            self.seconds += seconds
            tokens = sum(len(c.token_ids) for c in fresh)
            self.generated_tokens += tokens
            self.cache.update(zip(todo, fresh, strict=True))
            print(f"  generated {len(fresh)} completions, {tokens} tokens in {seconds:.0f} s "
                  f"({tokens / max(seconds, 1e-9):.0f} tok/s, load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        return [self.cache[self.key(r)] for r in requests]


def _requests(obs: dict, infos: dict, max_new: int, args: argparse.Namespace, tag: str) -> list:
    """One request per prompt of an observation, as the loop builds it (chat template, prefix and stop from the
    env)."""
    out = []
    for k, (prompt, spec) in enumerate(zip(obs["prompts"], infos["requests"], strict=True)):
        seed = int(np.random.SeedSequence([args.seed, zlib.crc32(tag.encode()), k]).generate_state(1)[0])
        out.append(GenerationRequest(
            adapter=None, prompt=prompt, max_new_tokens=max_new, temperature=args.temperature, top_p=args.top_p,
            seed=seed, chat=bool(spec["chat_template"]), prefix=spec["prefix"], stop=tuple(spec["stop"]),
        ))
    return out


def measure(variant: Variant, gen: CachedGenerator, sandbox: Sandbox, args: argparse.Namespace
            ) -> dict[str, tuple[Row, Row]]:
    """One env round per task type under ``variant`` (the types' generations batched together):
    task type -> (teacher row, student row)."""
    teachers = 4
    per_teacher = max(1, args.n_per_type // teachers)
    envs = {
        t: parallel_env(
            num_teachers=teachers, num_students=4, tasks_per_teacher=per_teacher, samples_per_task=1,
            task_types=(t,), references_k=args.references_k, require_think=args.require_think,
            lenient_answer_close=variant.lenient, prompts=variant.templates, seed=args.seed, sandbox=sandbox,
        )
        for t in args.types
    }
    rows = {t: (Row(), Row()) for t in args.types}

    def play(phase: str, obs: dict, infos: dict, max_new: int) -> dict[str, dict[str, list[Completion]]]:
        # the seed tag names the type and agent, not the variant: variants with equal prompts share samples
        plan = [(t, a, _requests(obs[t][a], infos[t][a], max_new, args, f"{t}/{a}"))
                for t, env in envs.items() for a in (env.teachers if phase == "propose" else env.students)]
        flat = gen.generate([r for _, _, reqs in plan for r in reqs])
        out: dict[str, dict[str, list[Completion]]] = {t: {} for t in args.types}
        for t, a, reqs in plan:
            out[t][a], flat = flat[: len(reqs)], flat[len(reqs) :]
        return out

    obs = {t: env.reset(seed=args.seed) for t, env in envs.items()}
    infos = {t: obs[t][1] for t in args.types}
    obs = {t: obs[t][0] for t in args.types}
    proposals = play("propose", obs, infos, args.teacher_tokens)
    obs1, infos1 = {}, {}
    for t, env in envs.items():
        obs1[t], _, _, _, infos1[t] = env.step({a: tuple(c.text for c in cs) for a, cs in proposals[t].items()})
        for a in env.teachers:
            for c, spec, p in zip(proposals[t][a], infos[t][a]["requests"], infos1[t][a]["proposals"], strict=True):
                rows[t][0].add(c, p["format_ok"], p["valid"], p["reason"], spec["prefix"])
    answers = play("solve", obs1, infos1, args.student_tokens)
    for t, env in envs.items():
        _, _, _, _, infos2 = env.step({a: tuple(c.text for c in cs) for a, cs in answers[t].items()})
        for a in env.students:
            for c, spec, r in zip(answers[t][a], infos1[t][a]["requests"], infos2[a]["completion_info"], strict=True):
                rows[t][1].add(c, r["format_ok"], r["correct"], r["reason"], spec["prefix"])
        env.close()
    return rows


def _fmt(v: float | int | None) -> str:
    return "–" if v is None else f"{v:g}"


def markdown(results: dict[str, dict[str, dict[str, dict]]], notes: dict[str, str]) -> str:
    lines = [
        "| variant | type | T n | T formatted % | T valid % | T truncated % | T tokens (median / p90 of formatted) "
        "| S n | S formatted % | S correct % | S truncated % | S tokens (median / p90 of formatted) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_type in results.items():
        rows = list(by_type.items())
        for task_type, roles in rows:
            t, s = roles["teacher"], roles["student"]
            lines.append(
                f"| {name} | {task_type} | {t['n']} | {t['formatted_pct']:g} | {t['passed_pct']:g} "
                f"| {t['truncated_pct']:g} | {_fmt(t['tokens_formatted_median'])} / {_fmt(t['tokens_formatted_p90'])} "
                f"| {s['n']} | {s['formatted_pct']:g} | {s['passed_pct']:g} | {s['truncated_pct']:g} "
                f"| {_fmt(s['tokens_formatted_median'])} / {_fmt(s['tokens_formatted_p90'])} |"
            )
    lines.append("")
    lines += [f"- `{name}`: {notes[name]}" for name in results]
    return "\n".join(lines)


def _total(by_type: dict[str, dict[str, dict]], role: str) -> dict[str, float]:
    """Pooled percentages over the task types of one variant."""
    n = sum(r[role]["n"] for r in by_type.values())

    def pooled(key: str) -> float:
        return round(sum(r[role][key] * r[role]["n"] for r in by_type.values()) / n, 1) if n else 0.0

    return {"n": n, "formatted_pct": pooled("formatted_pct"), "passed_pct": pooled("passed_pct"),
            "truncated_pct": pooled("truncated_pct")}


def main(argv: list[str] | None = None) -> None:
    known = variants()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="chat,chat+examples+open,small,small+lenient,azr",
                    help=f"comma-separated, from: {', '.join(known)}")
    ap.add_argument("--n-per-type", type=int, default=16)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--teacher-tokens", type=int, default=160)
    ap.add_argument("--student-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1, help="torch threads while generating")
    ap.add_argument("--references-k", type=int, default=1, help="reference tasks per proposer prompt (cpu-smoke: 1)")
    ap.add_argument("--require-think", action="store_true", help="AZR's <think> requirement (cpu-smoke: off)")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated task types to measure")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/format_rates")
    args = ap.parse_args(argv)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown or not chosen:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(known)}")
    if args.n_per_type < 4:
        ap.error("--n-per-type must be >= 4")
    args.types = tuple(t.strip() for t in args.types.split(",") if t.strip())
    if not args.types or set(args.types) - set(TYPES):
        ap.error(f"--types must name some of {', '.join(TYPES)}, got {args.types}")

    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    model, tokenizer = load_base(args.model, dtype=torch.float32)
    population = LoRAPopulation(model, ["m0"], rank=8, alpha=16, seed=args.seed)  # requests use adapter=None
    gen = CachedGenerator(HFGenerator(population, tokenizer, batch_size=args.batch_size, seed=args.seed))
    results: dict[str, dict[str, dict[str, dict]]] = {}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with Sandbox(workers=2, limits=Limits(timeout_s=2.0, memory_mb=512)) as sandbox:
        for name in chosen:
            t0 = time.perf_counter()
            rows = measure(known[name], gen, sandbox, args)
            results[name] = {t: {"teacher": rows[t][0].summary(), "student": rows[t][1].summary()} for t in args.types}
            tot_t, tot_s = _total(results[name], "teacher"), _total(results[name], "student")
            print(f"{name:<22} teachers {tot_t['formatted_pct']:5.1f}% formatted {tot_t['passed_pct']:5.1f}% valid "
                  f"{tot_t['truncated_pct']:5.1f}% cut | students {tot_s['formatted_pct']:5.1f}% formatted "
                  f"{tot_s['passed_pct']:5.1f}% correct {tot_s['truncated_pct']:5.1f}% cut "
                  f"(n {tot_t['n']}/{tot_s['n']}, {time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f})",
                  flush=True)
            (out_dir / "rates.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
            (out_dir / "rates.md").write_text(markdown(results, {n: known[n].note for n in results}) + "\n")
    elapsed = time.perf_counter() - t_start
    load1 = os.getloadavg()
    table = markdown(results, {n: known[n].note for n in results})
    footer = (
        f"\n\n`python benchmarks/format_rates.py --variants {','.join(chosen)} --n-per-type {args.n_per_type}"
        f" --types {','.join(args.types)} --teacher-tokens {args.teacher_tokens} --student-tokens {args.student_tokens}`: {args.model}, "
        f"T {args.temperature}, top-p {args.top_p}, references_k {args.references_k}, require_think "
        f"{args.require_think}, seed {args.seed}; {elapsed / 60:.1f} min, {gen.generated_tokens} tokens generated "
        f"in {gen.seconds:.0f} s ({gen.generated_tokens / max(gen.seconds, 1e-9):.0f} tok/s, batch "
        f"{args.batch_size}, {args.threads} thread(s)); load average {load0[0]:.1f} at start, {load1[0]:.1f} at end "
        f"({os.cpu_count()} cores)."
    )
    (out_dir / "rates.md").write_text(table + footer + "\n")
    (out_dir / "rates.json").write_text(json.dumps({"args": vars(args), "results": results,
                                                    "elapsed_s": elapsed, "load": [load0, load1]}, indent=1))
    print()
    print(table + footer)


if __name__ == "__main__":
    main()
