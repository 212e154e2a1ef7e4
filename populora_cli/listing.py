"""``populora list [KIND]``: what can be named in a preset or a flag, with one line of documentation and the
parameters of each, plugins included (``--plugins``).

Kinds: ``schemes`` (``--env.reward-scheme``, settings ``--env.reward-kwargs``), ``estimators``
(``--trainer.advantage``, settings ``--trainer.advantage-kwargs``), ``losses`` (loss aggregation modes,
``--trainer.loss-agg-mode``), ``operators`` (``--pbt.operators``,
``populora evolve --op``, settings ``--pbt.operator-params`` / ``--param``), ``fitness`` (``--pbt.fitness``),
``selections`` (``--pbt.selection``), ``matchings`` (``--env.matching``), ``presets`` (``--preset``),
``models`` (``--model``) and ``benchmarks`` (``populora eval --benchmarks``); no kind lists them all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import tyro

KINDS = ("schemes", "estimators", "losses", "operators", "fitness", "selections", "matchings", "presets", "models",
         "benchmarks")

__all__ = ["KINDS", "ListArgs", "entries", "list_main"]


@dataclass
class ListArgs:
    """List the registered names that a preset or a flag can use (reward schemes, advantage estimators, evolution
    operators, PBT fitness and selection rules, matching weightings, presets, models, benchmarks), each with its
    parameters and the first line of its documentation."""

    kind: Annotated[Literal["schemes", "estimators", "losses", "operators", "fitness", "selections", "matchings",
                            "presets", "models", "benchmarks"] | None, tyro.conf.Positional] = None
    """What to list (default: everything)."""
    plugins: tuple[str, ...] = field(default_factory=tuple)
    """Plugin modules (importable names or .py paths) to import first: what they register is listed too."""


@dataclass(frozen=True)
class Entry:
    name: str
    params: str
    doc: str


def first_line(text: str | None) -> str:
    """The first sentence-line of a docstring (empty when there is none)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines()]
    return lines[0] if lines else ""


def _params(defaults: Mapping[str, Any]) -> str:
    return ", ".join(k if v is inspect.Parameter.empty else f"{k}={v!r}" for k, v in defaults.items())


def _scheme_params(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]  # after the round's results
    except (TypeError, ValueError):
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in params if p.kind in kinds}


def _schemes() -> list[Entry]:
    from populora_env.rewards import get_reward_scheme, list_reward_schemes

    return [Entry(n, _params(_scheme_params(get_reward_scheme(n))), first_line(get_reward_scheme(n).__doc__))
            for n in list_reward_schemes()]


def _estimators() -> list[Entry]:
    from agents.advantages import estimator_params, get_advantage, list_advantages

    return [Entry(n, _params(estimator_params(get_advantage(n))), first_line(get_advantage(n).__doc__))
            for n in list_advantages()]


def _losses() -> list[Entry]:
    from agents.losses import get_loss_agg, list_loss_aggs

    return [Entry(n, "", first_line(get_loss_agg(n).__doc__)) for n in list_loss_aggs()]


def _operators() -> list[Entry]:
    from evolution.operators import list_operators

    return [Entry(op.name, _params(dict(op.defaults)),
                  f"[{op.family}, {op.arity} parent{'s' * (op.arity > 1)}] {op.summary}")
            for op in sorted(list_operators(), key=lambda o: o.name)]


def _fitness() -> list[Entry]:
    from evolution.selection import list_fitness

    return [Entry(f.name, _params(dict(f.defaults)), f.summary) for f in list_fitness()]


def _selections() -> list[Entry]:
    from evolution.selection import list_selections

    return [Entry(r.name, _params(dict(r.defaults)), r.summary) for r in list_selections()]


def _matchings() -> list[Entry]:
    from populora_env.matching import list_matchings

    return [Entry(m.name, _params(dict(m.defaults)), m.summary) for m in list_matchings()]


def _presets() -> list[Entry]:
    from selfplay.config import list_presets, preset_path, read_config_json

    out = []
    for name in list_presets():
        path = preset_path(name)
        comment = read_config_json(path, "preset").get("_comment", "") if path is not None else ""
        out.append(Entry(name, "", str(comment).split(". ")[0].rstrip(".")))
    return out


def _models() -> list[Entry]:
    from agents.model_names import RANDOM_PREFIX, random_shapes

    rows = [Entry("smollm2-135m", "", "SmolLM2-135M-Instruct, shipped offline as a GGUF (the CPU presets' model)"),
            Entry("tiny-random", "", "a 2-layer Llama with seeded random weights, built offline (tests, smoke checks)")]
    rows += [Entry(f"{RANDOM_PREFIX}{shape}", "", f"the {shape} architecture with seeded random weights (time and "
                   "memory at scale, no weights needed)") for shape in random_shapes()]
    rows.append(Entry("PATH", "", "a local Hugging Face model directory or a .gguf file"))
    return rows


def _benchmarks() -> list[Entry]:
    from evaluation.data import CODE_BENCHMARKS, MATH_BENCHMARKS, UNAVAILABLE_BENCHMARKS

    rows = [Entry(b, "", "code: pass@1 of the tests, run in the sandbox") for b in CODE_BENCHMARKS]
    rows += [Entry(b, "", "math: the final answer checked with math-verify") for b in MATH_BENCHMARKS]
    rows += [Entry(b, "", "not available offline: " + first_line(why).split(":")[0]) for b, why in
             UNAVAILABLE_BENCHMARKS.items()]
    return rows


SOURCES: dict[str, tuple[str, Callable[[], list[Entry]]]] = {
    "schemes": ("reward schemes: --env.reward-scheme NAME --env.reward-kwargs JSON", _schemes),
    "estimators": ("advantage estimators: --trainer.advantage NAME --trainer.advantage-kwargs JSON", _estimators),
    "losses": ("loss aggregation modes: --trainer.loss-agg-mode NAME", _losses),
    "operators": ("evolution operators: --pbt.operators JSON, populora evolve --op NAME --param KEY=VALUE",
                  _operators),
    "fitness": ("PBT fitness: --pbt.fitness NAME --pbt.fitness-kwargs JSON (populora test-selection --fitness)",
                _fitness),
    "selections": ("PBT selection rules: --pbt.selection NAME --pbt.selection-kwargs JSON (populora test-selection)",
                   _selections),
    "matchings": ("PFSP matching weightings: --env.matching NAME --env.matching-kwargs JSON --env.matching-random "
                  "SHARE (populora test-matching)", _matchings),
    "presets": ("presets: --preset NAME (or a .json file)", _presets),
    "models": ("models: --model NAME", _models),
    "benchmarks": ("benchmarks: populora eval --benchmarks NAME,NAME", _benchmarks),
}


def entries(kind: str) -> list[Entry]:
    """The entries of ``kind`` (one of :data:`KINDS`), as listed."""
    return SOURCES[kind][1]()


def render(kind: str, rows: Iterable[Entry]) -> str:
    rows = list(rows)
    names = [r.name + (f"({r.params})" if r.params else "") for r in rows]
    width = min(max((len(n) for n in names), default=0), 48)
    lines = [SOURCES[kind][0]]
    for name, row in zip(names, rows, strict=True):
        pad = name.ljust(width) if len(name) <= width else name + "\n" + " " * (width + 2)
        lines.append(f"  {pad}  {row.doc}".rstrip())
    return "\n".join(lines)


def list_main(argv: list[str]) -> int:
    """Entry of ``populora list`` (see the module docstring); returns the exit status."""
    from populora_cli.errors import fail
    from populora_cli.parsing import parse
    from selfplay.plugins import PluginError, load_plugins, normalize_plugin

    args = parse(ListArgs, argv, "populora list")
    try:
        load_plugins(normalize_plugin(p) for p in args.plugins)
    except PluginError as e:
        return fail("list", f"--plugins: {e}")
    kinds = [args.kind] if args.kind else list(KINDS)
    print("\n\n".join(render(k, entries(k)) for k in kinds))
    return 0
