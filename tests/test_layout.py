"""The import structure stays as docs/architecture.md describes it.

Pure AST and text checks (nothing of hone or JAX is imported), so the file runs in about a second:
- no recipe imports another recipe: a module of hone/recipes/ imports nothing of hone.recipes
  except the package itself (the dispatcher `recipe(command)`, which names the recipes by string
  and imports the one asked for when called), wherever the import stands, inside functions too;
- hone's modules import each other without a cycle, counting the imports that run when a module
  is loaded (module level, class bodies, `if TYPE_CHECKING:` blocks) and not those inside
  functions, which are the deliberate way to load a heavy module late;
- every package and module that docs/architecture.md's layout table names exists, and every
  package of hone/ is in the table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HONE = ROOT / "hone"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(HONE.rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The modules an import statement loads, named as hone names them: `from hone.x import y`
    is hone.x.y when y is a module of hone, else hone.x."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    names = [f"{base}.{alias.name}" for alias in node.names]
    return list(dict.fromkeys(name if name in MODULES else base for name in names))


def imports(module: str, *, module_level: bool) -> list[tuple[int, str]]:
    """(line, imported module) of every import in `module`; with module_level, only those that
    run when the module is loaded (function bodies are skipped, class bodies are not)."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(node.lineno, name) for name in imported(node, module)]
        todo.extend(ast.iter_child_nodes(node))
    return sorted(found)


def hone_graph() -> dict[str, set[str]]:
    """module -> the hone modules it imports when loaded."""
    return {m: {name for _, name in imports(m, module_level=True) if name in MODULES and name != m}
            for m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

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
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in groups:  # a shortest way back to the group's first module, found breadth-first
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in {w for v in frontier for w in graph[v]}:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        found.append(paths[last] + [start])
    return found


def test_no_recipe_imports_another_recipe():
    offenders = []
    for module in MODULES:
        if not module.startswith("hone.recipes."):
            continue
        for line, name in imports(module, module_level=False):
            if name.startswith("hone.recipes."):
                offenders.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {name}")
    # The dispatcher itself loads recipes by name when called, never when imported.
    for line, name in imports("hone.recipes", module_level=True):
        if name.startswith("hone.recipes."):
            offenders.append(f"hone/recipes/__init__.py:{line} imports {name} when loaded")
    assert not offenders, ("recipes import only from the layers below them (shared code "
                           "belongs in hone/train/, hone/rl/, ...):\n" + "\n".join(offenders))


def test_no_import_cycles():
    found = cycles(hone_graph())
    assert not found, "import cycles among hone's modules (module-level imports):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_cycle_finder_reports_the_modules_of_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]  # e -> e is skipped: hone_graph drops it
    assert cycles({"a": {"b"}, "b": set()}) == []


def layout_rows() -> list[list[str]]:
    """Each row of the table in architecture.md's Layout section as the backticked names of its
    first cell (the package) and of its last (the main modules)."""
    text = ARCHITECTURE.read_text()
    section = re.search(r"^## Layout\b.*?(?=^## |\Z)", text, re.S | re.M)
    assert section, "docs/architecture.md has no '## Layout' section"
    rows = [line for line in section.group(0).splitlines()
            if line.startswith("| `")]
    assert len(rows) >= 10, "the Layout table changed shape"
    cells = [row.strip().strip("|").split("|") for row in rows]
    return [re.findall(r"`([^`]+)`", c[0]) + re.findall(r"`([^`]+)`", c[-1]) for c in cells]


def test_architecture_layout_names_what_exists():
    missing, listed = [], set()
    for names in layout_rows():
        package, modules = names[0], names[1:]
        if not (ROOT / package).exists():
            missing.append(package)
            continue
        listed.add(package.rstrip("/"))
        for module in modules:
            if module.endswith((".py", "/")) and not (ROOT / package / module).exists():
                missing.append(package.rstrip("/") + "/" + module)
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    packages = {str(p.parent.relative_to(ROOT)) for p in HONE.glob("*/__init__.py")}
    unlisted = sorted(packages - listed)
    assert not unlisted, f"docs/architecture.md's layout omits {unlisted}"
