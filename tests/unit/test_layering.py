"""The import rules that keep the architecture readable (checked on the source, by AST).

- `policies/` imports nothing of ours; `ledger/` never imports `proxy/`.
- Inside `proxy/`: the MCP path (`proxy.mcp`) and the HTTP path (`proxy.http`) never import each
  other; neither imports the operator surface (`proxy.ops`) or the wiring (`proxy.app`); the
  shared layers (`proxy.runtime`, `proxy.telemetry`) import neither path nor `ops`/`app`.
- The edge (`proxy.edge`) and the listener (`proxy.listener`) import neither path, `ops` nor `app`.
- Inside `proxy.mcp`: `wire` imports nothing else of `proxy.mcp`; `pipeline` never imports
  `transport`, `upstreams` or `tasks` (it is handed a `send_upstream` callable); `upstreams` never
  imports `transport`, `pipeline` or `tasks`; `tasks` (like `transport`) wires them together.
- No import cycles among our modules (imports under `if TYPE_CHECKING:` count too: a circle of
  type imports is still a circle a reader has to untangle).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("policies", "ledger", "proxy")

# (importing package prefix, forbidden target prefixes, why)
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("policies", ("ledger", "proxy"), "policies/ holds pure decisions and imports nothing of ours"),
    ("ledger", ("proxy",), "ledger/ never imports proxy/"),
    ("proxy.mcp", ("proxy.http", "proxy.ops", "proxy.app"), "the MCP path stands alone"),
    ("proxy.http", ("proxy.mcp", "proxy.ops", "proxy.app"), "the HTTP path stands alone"),
    (
        "proxy.runtime",
        ("proxy.mcp", "proxy.http", "proxy.ops", "proxy.app"),
        "the shared runtime serves both paths and knows neither",
    ),
    (
        "proxy.telemetry",
        ("proxy.mcp", "proxy.http", "proxy.ops", "proxy.app"),
        "telemetry serves both paths and knows neither",
    ),
    (
        "proxy.mcp.wire",
        (
            "proxy.mcp.transport",
            "proxy.mcp.upstreams",
            "proxy.mcp.pipeline",
            "proxy.mcp.tasks",
            "proxy.mcp.catalog",
        ),
        "the wire format is pure",
    ),
    (
        "proxy.mcp.pipeline",
        ("proxy.mcp.transport", "proxy.mcp.upstreams", "proxy.mcp.tasks"),
        "the pipeline is handed its upstream; it never reaches for the transport",
    ),
    (
        "proxy.mcp.upstreams",
        ("proxy.mcp.transport", "proxy.mcp.pipeline", "proxy.mcp.tasks"),
        "upstreams know the wire, not the client side or the pipeline",
    ),
    ("proxy.state", ("proxy.mcp", "proxy.http", "proxy.ops", "proxy.app"), "state is shared"),
    (
        "proxy.edge",
        ("proxy.mcp", "proxy.http", "proxy.ops", "proxy.app"),
        "the edge judges every request before any path sees it",
    ),
    (
        "proxy.listener",
        ("proxy.mcp", "proxy.http", "proxy.ops", "proxy.app"),
        "the listener holds connections and knows no path",
    ),
    ("proxy.errors", ("proxy.",), "the exception tree imports nothing of ours"),
)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_within(name: str, prefix: str) -> bool:
    if prefix.endswith("."):
        return name.startswith(prefix)
    return name == prefix or name.startswith(prefix + ".")


def _imports(root: Path, path: Path, module: str) -> set[str]:
    """Every module of ours that `path` imports (`from a import b` counts `a.b` if it is one)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from package import module` imports the module; `from module import name` the module
            submodules = {f"{target}.{alias.name}" for alias in node.names}
            submodules = {name for name in submodules if _exists(root, name)}
            found.update(submodules or {target})
    return {name for name in found if name.split(".")[0] in PACKAGES and _exists(root, name)}


def _exists(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the modules of ours it imports, for every module under `PACKAGES`."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = _module_name(root, path)
            graph[module] = _imports(root, path, module) - {module}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Each forbidden import, as `importer -> imported (why)`."""
    found = []
    for importer, targets in sorted(graph.items()):
        for prefix, forbidden, why in RULES:
            if not _is_within(importer, prefix):
                continue
            for target in sorted(targets):
                if any(_is_within(target, bad) for bad in forbidden):
                    found.append(f"{importer} -> {target} ({why})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_source_tree_follows_the_import_rules():
    """No module of ours imports across a forbidden boundary."""
    assert violations(import_graph(REPO)) == []


def test_the_source_tree_has_no_import_cycles():
    """No two modules of ours import each other, directly or around a circle."""
    assert cycles(import_graph(REPO)) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_forbidden_import_is_reported(tmp_path: Path):
    """The checker itself says no: the MCP path importing the HTTP path is named, with the rule."""
    root = _tree(
        tmp_path,
        {
            "proxy/__init__.py": "",
            "proxy/mcp/__init__.py": "",
            "proxy/mcp/pipeline/__init__.py": "",
            "proxy/mcp/pipeline/calls.py": "from proxy.http import relay\n",
            "proxy/http/__init__.py": "",
            "proxy/http/relay.py": "",
            "policies/__init__.py": "from ledger import store\n",
            "ledger/__init__.py": "",
            "ledger/store.py": "",
        },
    )
    found = violations(import_graph(root))
    assert any(v.startswith("proxy.mcp.pipeline.calls -> proxy.http") for v in found)
    assert any(v.startswith("policies -> ledger") for v in found)


def test_a_cycle_through_type_only_imports_is_reported(tmp_path: Path):
    """A circle closed by an `if TYPE_CHECKING:` import is still a circle."""
    root = _tree(
        tmp_path,
        {
            "proxy/__init__.py": "",
            "proxy/a.py": "from proxy.b import thing\n",
            "proxy/b.py": "import typing\nif typing.TYPE_CHECKING:\n    import proxy.a\n",
            "policies/__init__.py": "",
            "ledger/__init__.py": "",
        },
    )
    assert cycles(import_graph(root)) == [["proxy.a", "proxy.b"]]
