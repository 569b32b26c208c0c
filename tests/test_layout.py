"""The layering: the library stays importable without Django, the app never imports
the service built on it, and no module imports one that imports it back."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGES = ("filterengine", "urlguard", "urlguard_service")
# Cycles being taken apart; none may be added. Delete an entry once its cycle is gone.
KNOWN_CYCLES: list[list[str]] = []


def test_filterengine_does_not_import_django():
    code = "import sys, filterengine; assert 'django' not in sys.modules, 'django imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the two packages."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its file (a function-level
    import closes a cycle as surely as one at the top)."""
    is_package = path.name == "__init__.py"
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from urlguard import sync` names a module; `from urlguard.sync
                # import sync` names something in one.
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else base)
    return {t for t in targets if t in modules and t != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    root = Path(__file__).resolve().parent.parent
    modules = _modules(root)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    report = [
        "; ".join(f"{m} imports {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(report)


def test_the_app_uses_nothing_of_the_service():
    """urlguard is what a site installs; urlguard_service is one such site."""
    root = Path(__file__).resolve().parent.parent
    modules = _modules(root)
    reaching = {
        name: sorted(t for t in _imports(name, path, modules) if t.startswith("urlguard_service"))
        for name, path in modules.items()
        if name.split(".")[0] in ("urlguard", "filterengine")
    }
    assert not {name: found for name, found in reaching.items() if found}


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
