"""The one YAML loader of the exporter's files (config, web config, scenarios, thresholds).

Errors are one line that starts with ``file:line``. Every mapping comes back as a
:class:`YamlMap`, a dict that also knows the line of each key, so a reader can name the line
of a bad value too. A key given twice is an error, not a silent override.

Example::

    >>> doc = parse("web:\\n  listen_address: ':9445'\\n", "config.yaml")
    >>> doc["web"]["listen_address"], doc["web"].where("listen_address")
    (':9445', 'config.yaml:2')
    >>> parse("a: 1\\na: 2\\n", "x.yaml")
    Traceback (most recent call last):
    ...
    gpu_exporter.yamlfile.YamlError: x.yaml:2: key 'a' is given twice (first on line 1)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


class YamlError(ValueError):
    """An unreadable or invalid YAML file; the message is one line starting with ``file:line``."""


class YamlMap(dict[Any, Any]):
    """A YAML mapping that remembers where it came from and the line of each key."""

    source: str = "<yaml>"
    lines: dict[Any, int]

    def where(self, key: Any) -> str:
        """``file:line`` of ``key`` (just ``file`` when unknown)."""
        line = getattr(self, "lines", {}).get(key)
        return f"{self.source}:{line}" if line is not None else self.source


class _Loader(yaml.SafeLoader):
    source = "<yaml>"


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[YamlMap]:
    data = YamlMap()
    data.source, data.lines = loader.source, {}
    yield data
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: explicit keys may override those
            continue
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        if key in data.lines:
            raise YamlError(f"{loader.source}:{line}: key {key!r} is given twice (first on line {data.lines[key]})")
        data.lines[key] = line
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        data.lines[key] = key_node.start_mark.line + 1
        data[key] = loader.construct_object(value_node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def parse(text: str, source: str) -> Any:
    """Parse one YAML document; ``source`` names it in errors (a file path)."""
    loader = _Loader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise YamlError(f"{source}{line}: invalid YAML: {problem}") from None
    finally:
        loader.dispose()


def load(path: str | Path, what: str = "file") -> Any:
    """Read and parse the YAML file ``path``; ``what`` names it in the error when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise YamlError(f"cannot read {what} {path}: {reason}") from None
    return parse(text, str(path))
