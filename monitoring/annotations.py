"""One Prometheus query per alert description, however many numbers it prints.

The problem: Prometheus expands the annotations of every pending and firing alert at every evaluation,
and each ``{{ with printf "..." ... | query }}`` in a description is a separate instant query (its own
parse, querier and index lookup). A cause alert's text looks up five to eight numbers (the GPU's
useful and busy utilization, the projection, the remedy's DataLoader settings), so at about one
active alert per GPU those lookups were ~80% of the alert groups' evaluation time (docs/fleet.md).

:func:`batched` rewrites a description so that it runs one query: every ``with ... | query`` block's
PromQL, tagged with its number in the label :data:`TAG` (``label_replace``) and joined with ``or``,
is queried once at the top into ``$found``; each block becomes a ``range`` over ``$found`` that prints
its body for its own tag (the template functions ``label`` and ``value``, which vmalert has too).
``topk by (tag) (1, ...)`` keeps one sample per block, as ``first`` did, and ``. | first`` in a body
becomes ``.`` (the sample). The text an alert renders is the same: promtool's
unit tests (prometheus/tests) and the real-Alertmanager tests compare it word for word.

>>> one, two = ('{{ with printf "%s{uuid=%%q}" $labels.uuid | query }}' % q for q in "ab")
>>> value = "{{ . | first | value }}{{ end }}"
>>> print(batched(f"Busy {one}{value}, ok{two} ({value}).")) # doctest: +NORMALIZE_WHITESPACE
{{ $found := printf `topk by (annotation_query) (1, label_replace(a{uuid=%q}, "annotation_query", "1", "", "")
or label_replace(b{uuid=%q}, "annotation_query", "2", "", ""))` $labels.uuid $labels.uuid | query }}Busy
{{ range $found }}{{ if eq (label "annotation_query" .) "1" }}{{ . | value }}{{ end }}{{ end }}, ok{{ range $found
}}{{ if eq (label "annotation_query" .) "2" }} ({{ . | value }}{{ end }}{{ end }}).
"""

from __future__ import annotations

import re

TAG = "annotation_query"
"""The label that tells the blocks' samples apart in the one query's result."""
_ACTION = re.compile(r"(\{\{.*?\}\})", re.DOTALL)
_ARG = r'\s+(?:"[^"]*"|\$labels\.(?:\w+|\$\{\w+\}))'
"""A printf argument the rewrite can move to the top: a string literal or a label (``${key}`` placeholders too)."""
_QUERY = re.compile(rf'^\{{\{{\s*with\s+printf\s+"((?:[^"`\\]|\\")*)"((?:{_ARG})*)\s*\|\s*query\s*\}}\}}$', re.DOTALL)
_OPENS = re.compile(r"^\{\{-?\s*(with|if|range)\b")
_ELSE = re.compile(r"^\{\{-?\s*else\b")
_END = re.compile(r"^\{\{-?\s*end\s*-?\}\}$")
_FIRST = re.compile(r"(?<![\w$.)])\.\s*\|\s*first\s*\|")
_DOT = re.compile(r"(?<![\w$.)\]])\.(?![\w.])")
_SAMPLE_USE = re.compile(r"\.\s*\|\s*(value|label)\b")


def batched(description: str) -> str:
    """``description`` with its ``with printf ... | query`` blocks answered by one query (unchanged with fewer
    than two). A block with an ``else`` keeps its own query. ValueError for a block this rewrite cannot keep
    equal (arguments other than ``$labels`` and string literals, a use of the block's result other than
    ``. | first | value`` or ``. | first | label``)."""
    tokens = [t for t in _ACTION.split(description) if t]
    has_else = _blocks_with_else(tokens)
    queries: list[tuple[str, str]] = []  # (format, arguments) in order of first appearance
    out: list[str] = []
    stack: list[str] = []  # per open block: "query" (batched), "scope" (a with/range that rebinds dot) or "if"
    for i, token in enumerate(tokens):
        if not token.startswith("{{"):
            out.append(token)
            continue
        found = _QUERY.match(token)
        if found and i not in has_else:
            fmt, args = found.group(1).replace('\\"', '"'), " ".join(found.group(2).split())  # a raw string below
            if (fmt, args) not in queries:
                queries.append((fmt, args))
            out.append(f'{{{{ range $found }}}}{{{{ if eq (label "{TAG}" .) "{queries.index((fmt, args)) + 1}" }}}}')
            stack.append("query")
            continue
        if not found and ("| query" in token or "|query" in token):
            raise ValueError(f"a query this rewrite does not know: {token}")
        if _END.match(token):
            out.append("{{ end }}{{ end }}" if stack.pop() == "query" else token)
            continue
        scopes = [kind for kind in stack if kind != "if"]  # an if keeps dot; with and range rebind it
        if scopes and scopes[-1] == "query":  # dot is the block's result: "first" of it is the sample range gives
            token = _FIRST.sub(". |", token)
            if any(not _SAMPLE_USE.match(token, dot.start()) for dot in _DOT.finditer(token)):
                raise ValueError(f"a use of a query's result other than '. | first | value' or '| label': {token}")
        if opened := _OPENS.match(token):
            stack.append("if" if opened.group(1) == "if" else "scope")
        out.append(token)
    if len(queries) < 2:
        return description
    parts = " or ".join(f'label_replace({fmt}, "{TAG}", "{i}", "", "")' for i, (fmt, _) in enumerate(queries, 1))
    args = " ".join(a for _, a in queries if a)
    return f"{{{{ $found := printf `topk by ({TAG}) (1, {parts})` {args} | query }}}}" + "".join(out)


def _blocks_with_else(tokens: list[str]) -> set[int]:
    """The indexes of the opening actions whose block has an ``else`` of its own; ValueError when the blocks do
    not nest."""
    stack: list[int] = []
    found: set[int] = set()
    for i, token in enumerate(tokens):
        if _OPENS.match(token):
            stack.append(i)
        elif _ELSE.match(token) and stack:
            found.add(stack[-1])
        elif _END.match(token):
            if not stack:
                raise ValueError(f"an {{{{ end }}}} without a block in: {''.join(tokens)}")
            stack.pop()
    if stack:
        raise ValueError(f"an unclosed block in: {''.join(tokens)}")
    return found
