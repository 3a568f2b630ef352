"""PromQL text the client commands write into their queries: matchers of many values and ranges.

Pure string building (no HTTP): :func:`any_of` (a label is one of many values), :func:`any_of_chunks` (the same
in matchers short enough for any store), :func:`promql_duration` (a range for a number of seconds).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def any_of(label: str, values: Sequence[str]) -> str:
    """A PromQL matcher: ``label`` is one of ``values`` (RE2's metacharacters escaped, the string quoted for PromQL).

    >>> print(any_of("run", ["b", "a.1", 'q"x']))
    run=~"a\\\\.1|b|q\\"x"
    """
    regex = "|".join(_REGEX_META.sub(r"\\\1", value) for value in sorted(set(values)))
    return f"{label}=~{json.dumps(regex, ensure_ascii=False)}"


MATCHER_LIMIT = 8192
"""The longest matcher :func:`any_of_chunks` writes: VictoriaMetrics refuses a query over ``-search.maxQueryLen``
(16 KiB by default, HTTP 422) even when POSTed, as the runs a fleet-wide diagnose names at 10,000 GPUs would be."""


def any_of_chunks(label: str, values: Sequence[str], limit: int = MATCHER_LIMIT) -> list[str]:
    """:func:`any_of` split into as few matchers as keep each within ``limit`` characters (one value per matcher at
    least): querying each and adding up the answers reads the same series as one matcher of all the values.

    >>> any_of_chunks("run", ["a", "b", "c"], limit=11)
    ['run=~"a|b"', 'run=~"c"']
    >>> any_of_chunks("run", [])
    []
    """
    chunks: list[list[str]] = []
    size = 0
    for value in sorted(set(values)):
        # the value's share of the matcher: escaped for RE2, then for the PromQL string, and its "|"
        cost = len(json.dumps(_REGEX_META.sub(r"\\\1", value), ensure_ascii=False)) - 1
        if chunks and size + cost <= limit:
            chunks[-1].append(value)
            size += cost
        else:
            chunks.append([value])
            size = len(label) + 4 + cost - 1  # label=~"..." around the first value, which has no "|"
    return [any_of(label, chunk) for chunk in chunks]


def promql_duration(seconds: float) -> str:
    """A PromQL range for ``seconds``: ``300.0 -> "300s"``, ``0.5 -> "500ms"``."""
    return f"{round(seconds)}s" if seconds >= 10 or seconds == round(seconds) else f"{round(seconds * 1000)}ms"
