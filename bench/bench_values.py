"""What a value type costs: `@immutable` against `@dataclass(frozen=True, slots=True)`.

    .venv/bin/python bench/bench_values.py [--classes 200] [--rounds 7]

The same five-field class body (two fields without a default, a default, a default
factory, an optional) is decorated `--classes` times by each decorator, in alternating
rounds; per class, the minimum over the rounds of:

- **defined**: the decorator alone (what importing a module of value types pays);
- **defined and built**: `@immutable` and a first instance (its `__init__` is compiled on
  first use), the cost of a value type a process does construct.

Then the methods a running daemon calls, per call (minimum of the rounds, `timeit`):
construct (two arguments, the default factory runs; five arguments), `==`, `hash`, `repr`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import timeit
from collections.abc import Callable
from dataclasses import field
from typing import Any

from wedgewatch.core.values import immutable

BODY = '''from __future__ import annotations
class Value{n}:
    """A value."""
    a: int
    b: str
    c: float = 1.0
    d: "tuple[int, ...]" = field(default_factory=tuple)
    e: "int | None" = None
'''
STANDARD = dataclasses.dataclass(frozen=True, slots=True)


def bodies(count: int, tag: str) -> list[type]:
    """`count` fresh undecorated classes of the body, as a module defines them."""
    made = []
    for i in range(count):
        namespace: dict[str, Any] = {"field": field, "__name__": "__main__"}
        exec(BODY.format(n=f"{tag}{i}"), namespace)  # noqa: S102 - the benchmark's own text
        made.append(namespace[f"Value{tag}{i}"])
    return made


def per_class(count: int, rounds: int) -> dict[str, float]:
    """Microseconds a class, the minimum over `rounds`."""
    ways: dict[str, Callable[[type], object]] = {
        "standard library, defined": STANDARD,
        "@immutable, defined": immutable,
        "@immutable, defined and built": lambda cls: immutable(cls)(1, "x"),
        "standard library, defined and built": lambda cls: STANDARD(cls)(1, "x"),
    }
    best = dict.fromkeys(ways, float("inf"))
    for round_ in range(rounds):
        for number, (name, way) in enumerate(ways.items()):
            classes = bodies(count, f"{round_}_{number}_")
            started = time.perf_counter()
            for cls in classes:
                way(cls)
            best[name] = min(best[name], (time.perf_counter() - started) / count * 1e6)
    return best


def per_call(rounds: int) -> dict[str, tuple[float, float]]:
    """Microseconds a call, standard library and `@immutable`."""
    standard, ours = STANDARD(bodies(1, "s")[0]), immutable(bodies(1, "i")[0])
    one, same = standard(1, "x"), standard(1, "x")
    other, equal = ours(1, "x"), ours(1, "x")
    calls: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "construct, 2 arguments": (lambda: standard(1, "x"), lambda: ours(1, "x")),
        "construct, 5 arguments": (
            lambda: standard(1, "x", 2.0, (), 3),
            lambda: ours(1, "x", 2.0, (), 3),
        ),
        "==": (lambda: one == same, lambda: other == equal),
        "hash": (lambda: hash(one), lambda: hash(other)),
        "repr": (lambda: repr(one), lambda: repr(other)),
    }
    number = 20_000
    return {
        name: tuple(  # type: ignore[misc]
            min(timeit.repeat(call, number=number, repeat=rounds)) / number * 1e6 for call in pair
        )
        for name, pair in calls.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    for name, micros in per_class(options.classes, options.rounds).items():
        print(f"{name:<40} {micros:8.1f} us a class")
    print(f"{'per call':<24} {'standard':>10} {'@immutable':>11}")
    for name, (theirs, ours) in per_call(options.rounds).items():
        print(f"{name:<24} {theirs:8.3f}us {ours:9.3f}us")


if __name__ == "__main__":
    main()
