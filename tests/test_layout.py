"""The layering: the library stays importable without Django, the app never imports
the service built on it, its sub-packages import each other only in the directions
below (README's "Layout" draws them), and no module imports one that imports it back."""

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

PACKAGES = ("filterengine", "urlguard", "urlguard_service")
# Cycles being taken apart; none may be added. Delete an entry once its cycle is gone.
KNOWN_CYCLES: list[list[str]] = []


# A module past this is more than one job: split it by job, as dnsserver's TCP slots
# and rate limiter were. The two exempt are one table each, read top to bottom.
MAX_MODULE_LINES = 750
LONG_MODULES = {"urlguard/conf.py", "urlguard/hotpath/canonical.py"}


def _long_modules(root: Path) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES and name not in LONG_MODULES:
                found.append(f"{name}: {lines} lines")
    return found


def test_no_module_is_longer_than_750_lines_but_the_settings_table_and_the_canonicalizer():
    assert not _long_modules(Path(__file__).resolve().parent.parent)


def test_a_long_module_is_reported(tmp_path):
    (tmp_path / "urlguard" / "hotpath").mkdir(parents=True)
    (tmp_path / "urlguard" / "big.py").write_text("x = 1\n" * 751)
    (tmp_path / "urlguard" / "fits.py").write_text("x = 1\n" * 750)
    (tmp_path / "urlguard" / "conf.py").write_text("x = 1\n" * 2000)
    (tmp_path / "urlguard" / "hotpath" / "canonical.py").write_text("x = 1\n" * 2000)
    assert _long_modules(tmp_path) == ["urlguard/big.py: 751 lines"]


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
                # `from urlguard.nodesync import sync` names a module; `from urlguard.nodesync.sync
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


def _package(module: str) -> str:
    """The package a module belongs to: one of the app's sub-packages or top-level
    modules (`urlguard.models`, `urlguard.conf`), else its top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "urlguard" else parts[0]


def _package_ties(modules: dict[str, Path]) -> list[str]:
    """Each cycle between packages, with the imports that close it (function-level
    imports included: `_imports` reads the whole file)."""
    graph: dict[str, set[str]] = {_package(name): set() for name in modules}
    closing: dict[tuple[str, str], list[str]] = {}
    for name, path in modules.items():
        for target in _imports(name, path, modules):
            ends = (_package(name), _package(target))
            if ends[0] != ends[1]:
                graph[ends[0]].add(ends[1])
                closing.setdefault(ends, []).append(f"{name} imports {target}")
    return [
        "; ".join(why for a in cycle for b in cycle if (a, b) in closing for why in closing[a, b])
        for cycle in _cycles(graph)
    ]


def test_no_two_packages_import_each_other():
    """Module cycles aside, no package imports one that imports it back, either way:
    the foundation's own imports and the entry points' included."""
    root = Path(__file__).resolve().parent.parent
    ties = _package_ties(_modules(root))
    assert not ties, "packages importing each other:\n" + "\n".join(ties)


def test_a_tie_between_packages_through_a_function_is_reported(tmp_path):
    package = tmp_path / "urlguard"
    for sub in ("models", "runtime"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "models" / "rows.py").write_text("def f():\n    from urlguard.runtime import sql\n")
    (package / "runtime" / "sql.py").write_text("")
    (package / "runtime" / "stats.py").write_text("from urlguard.models import rows\n")
    modules = {
        name: path for name, path in _modules(tmp_path).items() if name.startswith("urlguard")
    }
    assert _package_ties(modules) == [
        "urlguard.models.rows imports urlguard.runtime.sql; "
        "urlguard.runtime.stats imports urlguard.models.rows"
    ]


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


# The app's concerns, lowest first. A sub-package may import itself, the foundation
# (settings, models, checks, the Celery shim, wording) and the packages listed for it;
# `admin` (every package's admin pages), the optional apps of `contrib` and the app's
# entry points (AppConfig, urls, the task list, management commands, template tags,
# validators, the fixed public paths) may import any.
FOUNDATION = {"conf", "checks", "celery", "models", "wording", "migrations"}
ALLOWED = {
    "runtime": set(),
    "nodesync": {"runtime"},
    "hotpath": {"runtime", "nodesync"},
    "writepath": {"runtime", "nodesync", "hotpath"},
    "reports": {"runtime", "nodesync", "hotpath", "writepath"},
    "shortlinks": {"runtime", "nodesync", "hotpath"},
    "content": {"runtime", "nodesync", "hotpath"},
    "operations": {"runtime", "nodesync", "hotpath", "content"},
    "exports": {"runtime", "nodesync", "hotpath", "writepath", "operations"},
    "jobs": {"runtime", "nodesync", "hotpath", "writepath", "shortlinks"},
    "feeds": {"runtime", "nodesync", "hotpath", "writepath", "jobs"},
    "safebrowsing": {"runtime", "nodesync", "hotpath", "writepath", "operations", "exports"},
}


def _concern(module: str) -> str | None:
    """The sub-package a module of the app belongs to; None for the entry points. Each
    package's Django `admin` module is the admin's, whatever package holds it."""
    parts = module.split(".")
    if parts[0] != "urlguard" or len(parts) < 2:
        return None
    if parts[-1] == "admin" or parts[1] == "admin":
        return None
    if parts[1] in FOUNDATION:
        return "foundation"
    return parts[1] if parts[1] in ALLOWED else None


def _wrong_directions(modules: dict[str, Path]) -> list[str]:
    wrong = []
    for name, path in sorted(modules.items()):
        concern = _concern(name)
        if concern is None or concern == "foundation":
            continue
        for target in sorted(_imports(name, path, modules)):
            other = _concern(target)
            if other is None and target.startswith("urlguard"):
                other = target  # an entry point: never imported from inside a concern
            if other in (None, concern, "foundation") or other in ALLOWED[concern]:
                continue
            wrong.append(f"{name} ({concern}) imports {target} ({other})")
    return wrong


def test_each_concern_imports_only_the_ones_beneath_it():
    root = Path(__file__).resolve().parent.parent
    wrong = _wrong_directions(_modules(root))
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_every_package_of_the_app_has_a_place_in_the_layering():
    root = Path(__file__).resolve().parent.parent
    packages = {p.parent.name for p in (root / "urlguard").glob("*/__init__.py")}
    entry = {"management", "templatetags", "admin", "contrib"}
    assert packages - entry - FOUNDATION - set(ALLOWED) == set()


def test_the_readme_draws_the_same_directions():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    drawn = {}
    for line in readme.split("Imports go only downwards", 1)[1].split("```")[1].splitlines():
        if "->" in line:
            concern, targets = (part.strip() for part in line.split("->"))
            drawn[concern] = {t.strip() for t in targets.split(",") if t.strip()}
    assert drawn == ALLOWED


def test_the_directions_are_a_layering():
    """No two concerns may each import the other: the allowed table itself has no cycle."""
    assert _cycles({k: set(v) for k, v in ALLOWED.items()}) == []


def test_a_wrong_direction_is_reported(tmp_path):
    package = tmp_path / "urlguard"
    for sub in ("runtime", "hotpath"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "runtime" / "low.py").write_text("from urlguard.hotpath import high\n")
    (package / "hotpath" / "high.py").write_text("")
    modules = {
        name: path for name, path in _modules(tmp_path).items() if name.startswith("urlguard")
    }
    assert _wrong_directions(modules) == [
        "urlguard.runtime.low (runtime) imports urlguard.hotpath.high (hotpath)"
    ]


def test_the_app_reads_the_filter_file_only_through_the_engines_public_names():
    """No module outside filterengine knows the file format: the app imports the
    package (its __init__ names the public API), never one of its modules; only the
    atomic-file helper, which knows no filter, is shared."""
    root = Path(__file__).resolve().parent.parent
    modules = _modules(root)
    reaching = {
        name: sorted(
            t
            for t in _imports(name, path, modules)
            if t.startswith("filterengine.") and t != "filterengine.atomicfile"
        )
        for name, path in modules.items()
        if name.split(".")[0] in ("urlguard", "urlguard_service")
    }
    assert not {name: found for name, found in reaching.items() if found}


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_write_path_never_imports_the_feeds():
    """A refresh hands the write path a plan, data only (urlguard.writepath.plan): the
    write path applies it and never calls back into the code that made it."""
    root = Path(__file__).resolve().parent.parent
    modules = _modules(root)
    reaching = {
        name: sorted(t for t in _imports(name, path, modules) if t.startswith("urlguard.feeds"))
        for name, path in modules.items()
        if name.startswith("urlguard.writepath")
    }
    assert not {name: found for name, found in reaching.items() if found}


def _test_module_imports(root: Path) -> list[str]:
    """Each import of a test module (tests/**/test_*.py) by another file of tests/."""
    tests = root / "tests"
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts): path for path in tests.rglob("*.py")
    }
    test_modules = {name for name, path in modules.items() if path.name.startswith("test_")}
    found = []
    for name, path in sorted(modules.items()):
        package = name.split(".")[: -1 if path.name != "__init__.py" else None]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package[: len(package) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = {base} | {f"{base}.{alias.name}" for alias in node.names}
            else:
                continue
            for target in sorted(targets & test_modules - {name}):
                found.append(f"{path.relative_to(root)} imports {target}")
    return found


def test_no_file_of_the_tests_imports_a_test_module():
    """Shared helpers and fixtures live in tests/support (fixtures reach a folder through
    its conftest.py): a test module imported by another runs its module-level code
    twice over and ties the two files' fates."""
    assert not _test_module_imports(Path(__file__).resolve().parent.parent)


def test_an_import_of_a_test_module_is_reported(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "support").mkdir()
    (tmp_path / "tests" / "a" / "test_one.py").write_text("X = 1\n")
    (tmp_path / "tests" / "a" / "test_two.py").write_text(
        "from tests.a.test_one import X\nfrom . import test_one\nimport tests.a.test_one\n"
        "from tests.support.helpers import test_data\n"
    )
    (tmp_path / "tests" / "support" / "helpers.py").write_text("def test_data(): ...\n")
    (tmp_path / "tests" / "a" / "conftest.py").write_text("from .test_one import X\n")
    assert _test_module_imports(tmp_path) == [
        "tests/a/conftest.py imports tests.a.test_one",
        "tests/a/test_two.py imports tests.a.test_one",
        "tests/a/test_two.py imports tests.a.test_one",
        "tests/a/test_two.py imports tests.a.test_one",
    ]


def _carries_code(hint: str) -> bool:
    """Whether a type hint, as written, names a callable, an iterator, a generator or
    a thread anywhere inside it (Optional[...], a list of ..., a union)."""
    return bool(re.search(r"\b(Callable|Iterator|Iterable|Generator|Thread|lambda)\b", hint))


def test_only_data_crosses_into_the_apply():
    """No callable, generator or thread crosses the seam: what the apply takes, and
    every field of the plans it takes, is data (progress goes to the job's row)."""
    import dataclasses

    from urlguard.writepath import apply, plan

    taken = {
        f"apply.{name}({parameter.name})": str(parameter.annotation)
        for name in apply.__all__
        if inspect.isfunction(getattr(apply, name))
        for parameter in inspect.signature(getattr(apply, name)).parameters.values()
    }
    assert taken["apply.apply_listing(plan)"] == "ListingPlan | ChangePlan"
    for cls in (plan.ListingPlan, plan.ChangePlan, plan.Additions, plan.Entries):
        taken.update({f"{cls.__name__}.{f.name}": str(f.type) for f in dataclasses.fields(cls)})
    assert not {where: hint for where, hint in taken.items() if _carries_code(hint)}
    assert _carries_code("Callable[[str, int, int], None] | None")
    assert _carries_code("list[Iterator[int]]") and not _carries_code("list[Entries]")
