"""What a job's claim costs the host to read: bounded by the expected value, not by what the job sends.

A job's value comes back as text the host parses (``ast.literal_eval``) to compare with an expected value. A
job chooses that text, up to the sandbox's reply cap, and parsing costs time in proportion to it (and more for
nested sets and dicts). Since issue 39 a claim longer than any ``repr`` of a value equal to the expected one
(``literals.max_equal_repr_chars``) is refused before it is parsed (``literals.literal_matches``, and
``same_value`` for validation's second run); ``populora eval`` refuses a candidate's reply longer than what its
harness can send for the outputs asked (``evaluation.code._claim_bound``).

For each claim shape (about ``--mb`` MB of text) this prints the median time, over ``--repeats`` rounds, of the
unbounded comparison the host made before (``literal_equal``: parse both, compare) next to the bounded one, in
one run, and the time the host needs to read a legitimate claim of that size in ``populora eval`` (a string
literal, then JSON). Run: ``python benchmarks/claims.py [--mb 10] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import time

from evaluation.code import _claim_bound
from populora_env.literals import literal_equal, literal_matches, same_value


def _claims(size: int) -> dict[str, str]:
    """Claims of about ``size`` characters: the shapes that cost the host most per character."""
    n_ints = size // 9
    n_sets = size // 25
    return {
        "list of ints": "[" + ", ".join(["1234567"] * n_ints) + "]",
        "set of frozensets": "{" + ", ".join(f"frozenset({{{i}, {i + 1}}})" for i in range(n_sets)) + "}",
        "dict": "{" + ", ".join(f"{i}: {i}" for i in range(size // 12)) + "}",
        "string": repr("x" * size),
    }


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=10.0, help="claim size in millions of characters")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = int(args.mb * 1_000_000)
    expected = "[4, 5, 6]"  # a gold output of the env's size (max_output_chars 1000)
    print(f"claims of about {args.mb:g} M characters, expected value {expected!r}; median of {args.repeats}")
    print(f"{'claim':<20} {'chars':>10} {'before (s)':>11} {'bounded (s)':>12} {'second run (s)':>15}")
    for name, claim in _claims(size).items():
        before = _median(lambda c=claim: literal_equal(c, expected), args.repeats)
        after = _median(lambda c=claim: literal_matches(c, expected), args.repeats)
        second = _median(lambda c=claim: same_value(expected, c), args.repeats)
        print(f"{name:<20} {len(claim):>10} {before:>11.3f} {after:>12.6f} {second:>15.6f}")
    # populora eval: a candidate's reply is the repr of a JSON text; a legitimate one of this size, and a forged
    # one for a task of 3 outputs (refused before parsing)
    text = json.dumps({"outputs": [{"r": repr("y" * 1000)}] * (size // 1100), "stopped": None})
    reply = repr(text)
    read = _median(lambda: json.loads(ast.literal_eval(reply)), args.repeats)
    refused = _median(lambda: len(reply) > _claim_bound(3) or json.loads(ast.literal_eval(reply)), args.repeats)
    print(f"populora eval reply of {len(reply)} chars: read {read:.3f} s (legitimate for {size // 1100} outputs); "
          f"for a task of 3 outputs refused in {refused:.6f} s (bound {_claim_bound(3)} chars)")


if __name__ == "__main__":
    main()
