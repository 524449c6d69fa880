"""Reading the configuration's YAML: duplicate keys refused, every key's line remembered, and
errors that name the file, line, key path, value and why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from policies.config_errors import ConfigError

__all__ = ["MISSING", "ConfigError", "KeyPath", "Loader", "Reporter", "dig", "fmt_path", "line_map"]

KeyPath = tuple[str | int, ...]


def fmt_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class Loader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (PyYAML would silently keep the last one)."""


def _construct_mapping(loader: Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"duplicate key {key!r} (first at line {seen[key]})",
                path=str(key),
                line=key_node.start_mark.line + 1,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def line_map(
    node: yaml.Node | None, path: KeyPath = (), out: dict[KeyPath, int] | None = None
) -> dict[KeyPath, int]:
    """Map each key path of the document to the line (1-based) where its value starts."""
    out = {} if out is None else out
    if node is None:
        return out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, str(key_node.value))
            out[child] = key_node.start_mark.line + 1
            line_map(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            line_map(item, (*path, index), out)
    return out


class Reporter:
    """Builds `ConfigError`s that point at the line of the offending key."""

    def __init__(self, source: str, lines: Mapping[KeyPath, int]) -> None:
        self.source = source
        self.lines = lines

    def line_of(self, path: KeyPath) -> int | None:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return None

    def error(self, path: KeyPath, value: Any, why: str) -> ConfigError:
        line = self.line_of(path)
        where = f"{self.source}:{line}" if line else self.source
        shown = "" if value is MISSING else f" = {value!r}"
        return ConfigError(
            f"{where}: {fmt_path(path)}{shown}: {why}", path=fmt_path(path), line=line
        )


MISSING = object()


def dig(data: Any, path: KeyPath) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return data
