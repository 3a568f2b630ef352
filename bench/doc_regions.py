"""The marked regions of a page the benches write (docs/benchmarks.md): a bench rewrites its own regions and
keeps every other byte of the page.

A region is the text between ``<!-- NAME: begin -->`` and ``<!-- NAME: end -->``, each marker on a line of its
own; NAME says which bench writes it (``bench.run.headline``, ``bench.cuda_path``, ``bench.fleet_scale``). What
is outside every region (a section a person wrote, the notes under a generated table) is never touched.

>>> page = "# B\\n\\n" + region("bench.x", "## X\\n\\nold\\n") + "\\nkept by hand\\n"
>>> update(page, region("bench.x", "## X\\n\\nnew\\n"))
'# B\\n\\n<!-- bench.x: begin -->\\n## X\\n\\nnew\\n<!-- bench.x: end -->\\n\\nkept by hand\\n'
"""

from __future__ import annotations

import re

REGION = re.compile(r"^<!-- (?P<name>[\w.-]+): begin -->\n.*?^<!-- (?P=name): end -->\n", re.M | re.S)
"""One marked region, its markers included."""
BEGIN_MARK = re.compile(r"^<!-- (?P<name>[\w.-]+): begin -->$", re.M)


def begin(name: str) -> str:
    """The line that opens region ``name``."""
    return f"<!-- {name}: begin -->\n"


def end(name: str) -> str:
    """The line that closes region ``name``."""
    return f"<!-- {name}: end -->\n"


def region(name: str, text: str) -> str:
    """``text`` marked as region ``name`` (ending with a newline)."""
    return begin(name) + text.rstrip("\n") + "\n" + end(name)


def regions(page: str) -> dict[str, str]:
    """Name -> the region with its markers, in the page's order; a region opened and never closed, or marked
    twice, is a ValueError (a rewrite could not tell what to keep)."""
    found: dict[str, str] = {}
    for m in REGION.finditer(page):
        if m["name"] in found:
            raise ValueError(f"region {m['name']} is marked twice")
        found[m["name"]] = m.group(0)
    opened = [m["name"] for m in BEGIN_MARK.finditer(page)]
    if len(opened) != len(found):
        unclosed = sorted(set(opened) - set(found)) or sorted({n for n in opened if opened.count(n) > 1})
        raise ValueError(f"region {', '.join(unclosed)} has no end marker of its own")
    return found


def update(old: str, new: str) -> str:
    """``old`` with each region that ``new`` writes replaced by ``new``'s, everything else of ``old`` as it was.

    A region of ``new`` that ``old`` lacks goes in after the region that comes before it in ``new`` (before the
    first region ``old`` has, when none comes before it; at the end when ``old`` has none of ``new``'s). Text of
    ``new`` outside its regions (a title) is used only when ``old`` is empty.

    >>> old = "# T\\n\\n" + region("a", "A1") + "\\nnote\\n\\n" + region("c", "C1")
    >>> print(update(old, "# ignored\\n" + region("a", "A2") + region("b", "B2") + region("c", "C2")), end="")
    # T
    <BLANKLINE>
    <!-- a: begin -->
    A2
    <!-- a: end -->
    <BLANKLINE>
    <!-- b: begin -->
    B2
    <!-- b: end -->
    <BLANKLINE>
    note
    <BLANKLINE>
    <!-- c: begin -->
    C2
    <!-- c: end -->
    """
    if not old.strip():
        return new
    fresh = regions(new)
    present = regions(old)
    order = list(fresh)
    after: dict[str | None, list[str]] = {}
    """Where each region missing from ``old`` goes: after the named region of ``old`` (None: before the first)."""
    for i, name in enumerate(order):
        if name not in present:
            anchor = next((n for n in reversed(order[:i]) if n in present), None)
            after.setdefault(anchor, []).append(name)
    if not any(name in present for name in order):
        return old.rstrip("\n") + "\n" + "".join("\n" + fresh[name] for name in order)
    out: list[str] = []
    pos = 0
    first = True
    for m in REGION.finditer(old):
        name = m["name"]
        out.append(old[pos:m.start()])
        if first and name in fresh:
            out += [fresh[n] + "\n" for n in after.get(None, [])]
            first = False
        out.append(fresh.get(name, m.group(0)))
        out += ["\n" + fresh[n] for n in after.get(name, [])]
        pos = m.end()
    out.append(old[pos:])
    return "".join(out)
