"""The import structure stays as docs/architecture.md describes it.

Pure AST and text checks (nothing of hone or JAX is imported), so the file runs in about a second.
Every import counts, wherever it stands: module level, class bodies, `if TYPE_CHECKING:` blocks and
inside functions (an import placed in a function still makes its module depend on the other one;
it only loads it later). The checks:
- floors: docs/architecture.md's Floors table gives every unit of hone/ (a package, or a module
  directly under hone/) a floor; a unit imports only from units on lower floors, so no two
  packages import each other and there are no upward arrows;
- no cycle among hone's modules;
- recipes on the top floor: hone.recipes is imported by the command line and the pipeline only,
  and a recipe imports no other recipe (the dispatcher names them by string);
- no private name (`_x`) imported from another module;
- the tokenizer imports no model code, directly or through what it imports;
- a file name means one role: a name used in two packages is one of SHARED_NAMES, the topics
  that recur in each layer (the SFT data, loss, objective and recipe);
- every package and module that the Layout table names exists, and every module of hone/ is
  named there.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HONE = ROOT / "hone"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# File names that more than one package uses, each for the same topic in that package's layer:
# the algorithm's data (data/), loss (losses/), objective (train/, rl/), recipe (recipes/), ...
SHARED_NAMES = {
    "sft.py": "SFT: its data, loss and recipe",
    "kto.py": "KTO: its data, loss and recipe",
    "grpo.py": "GRPO: its recipe and its bench row",
    "preference.py": "preference pairs: their data and losses",
    "distill.py": "distillation: its loss and recipe",
    "reward.py": "reward models: the network and the recipe",
    "moe.py": "mixture of experts: the routed MLP and the router's losses",
    "step.py": "the jitted update: train's generic step, rl's RL step",
    "command.py": "a `hone X` command's entry: bench, eval, plan",
    # The twin rollouts (single turn, agent episode) become one path with the rollout engine.
    "rollout.py": "rollouts: single turns (rl/), agent episodes (agents/), their bench row",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(HONE.rglob("*.py"))}


def unit(module: str) -> str:
    """The unit a module belongs to: `hone/x/` for a package's modules, `hone/x.py` for a
    module directly under hone/, `hone/__init__.py` for the facade."""
    parts = module.split(".")
    if len(parts) == 1:
        return "hone/__init__.py"
    if (HONE / parts[1]).is_dir():
        return f"hone/{parts[1]}/"
    return f"hone/{parts[1]}.py"


def imported(node: ast.Import | ast.ImportFrom, importer: str) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for an import statement, modules named as hone names them:
    `from hone.x import y` loads hone.x.y when y is a module of hone, else takes y from hone.x."""
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    found: dict[str, list[str]] = {}
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in MODULES:
            found.setdefault(sub, [])
        else:
            found.setdefault(base, []).append(alias.name)
    return list(found.items())


def imports(module: str) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names taken) of every import statement in `module`."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    return sorted((node.lineno, name, names) for node in ast.walk(tree)
                  if isinstance(node, (ast.Import, ast.ImportFrom))
                  for name, names in imported(node, module))


IMPORTS = {m: imports(m) for m in MODULES}


def hone_graph() -> dict[str, set[str]]:
    """module -> the hone modules it imports (anywhere in it)."""
    return {m: {name for _, name, _ in IMPORTS[m] if name in MODULES and name != m}
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


def section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    found = re.search(rf"^## {title}\b.*?(?=^## |\Z)", text, re.S | re.M)
    assert found, f"docs/architecture.md has no '## {title}' section"
    return found.group(0)


def floors() -> dict[str, int]:
    """unit -> floor, from the Floors table: rows `| N | `hone/x/`, `hone/y.py` | ... |`."""
    table = {}
    for line in section("Floors").splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for name in re.findall(r"`([^`]+)`", row.group(2)):
                assert name not in table, f"the Floors table names {name} twice"
                table[name] = int(row.group(1))
    return table


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_unit_has_a_floor():
    table = floors()
    units = {unit(m) for m in MODULES}
    missing, extra = sorted(units - set(table)), sorted(set(table) - units)
    assert not missing, f"docs/architecture.md's Floors table omits {missing}"
    assert not extra, f"the Floors table names what does not exist: {extra}"


def test_imports_go_down_the_floors():
    table = floors()
    upward = []
    for module in MODULES:
        for line, name, _ in IMPORTS[module]:
            if name not in MODULES:
                continue
            a, b = unit(module), unit(name)
            if a != b and table[b] >= table[a]:
                upward.append(f"{where(module, line)} imports {name} "
                              f"({a} floor {table[a]} -> {b} floor {table[b]})")
    assert not upward, ("a unit imports only from lower floors (move the shared code down, "
                        "see docs/architecture.md):\n" + "\n".join(upward))


def package_arrows() -> dict[tuple[str, str], int]:
    arrows: dict[tuple[str, str], int] = defaultdict(int)
    for module in MODULES:
        for _, name, _ in IMPORTS[module]:
            if name in MODULES and unit(module) != unit(name):
                arrows[unit(module), unit(name)] += 1
    return arrows


def test_no_two_packages_import_each_other():
    arrows = package_arrows()
    both = sorted({tuple(sorted(pair)) for pair in arrows if pair[::-1] in arrows})
    assert not both, f"packages that import each other: {both}"


def test_no_import_cycles():
    found = cycles(hone_graph())
    assert not found, "import cycles among hone's modules:\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_cycle_finder_reports_the_modules_of_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]  # e -> e is skipped: hone_graph drops it
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_recipes_are_the_top_floor():
    offenders = []
    allowed = {"hone.cli", "hone.pipeline"}
    for module in MODULES:
        for line, name, _ in IMPORTS[module]:
            if not (name == "hone.recipes" or name.startswith("hone.recipes.")):
                continue
            if module.startswith("hone.recipes."):
                if name != "hone.recipes" or module == "hone.recipes":
                    offenders.append(f"{where(module, line)} imports {name}")
            elif module not in allowed and module != "hone.recipes":
                offenders.append(f"{where(module, line)} imports {name}")
    # The dispatcher loads a recipe by its name when called, never by an import statement.
    offenders += [f"{where('hone.recipes', line)} imports {name}"
                  for line, name, _ in IMPORTS["hone.recipes"] if name.startswith("hone.recipes.")]
    assert not offenders, ("recipes are imported by the command line and the pipeline only, and "
                           "never by each other (shared code belongs in train/, rl/, ...):\n"
                           + "\n".join(offenders))


def test_no_private_name_is_imported_from_another_module():
    offenders = [f"{where(module, line)} takes {n} from {name}"
                 for module in MODULES for line, name, names in IMPORTS[module]
                 if name in MODULES for n in names if n.startswith("_")]
    assert not offenders, ("a name another module needs is public (no leading underscore), or "
                           "moves to a module both import:\n" + "\n".join(offenders))


def test_the_tokenizer_imports_no_model_code():
    graph, seen, todo = hone_graph(), set(), ["hone.tokenizer"]
    while todo:
        module = todo.pop()
        for name in graph[module] - seen:
            seen.add(name)
            todo.append(name)
    assert not sorted(m for m in seen if m.startswith("hone.models")), sorted(seen)


def test_a_file_name_means_one_role():
    packages = defaultdict(set)
    for path in MODULES.values():
        if path.name != "__init__.py":
            packages[path.name].add(str(path.parent.relative_to(ROOT)))
    repeated = {name: sorted(where) for name, where in packages.items() if len(where) > 1}
    unexplained = {name: where for name, where in repeated.items() if name not in SHARED_NAMES}
    assert not unexplained, ("a file name used in several packages for different roles: rename "
                             "one, or add it to SHARED_NAMES with the topic it shares: "
                             f"{unexplained}")
    stale = sorted(set(SHARED_NAMES) - set(repeated))
    assert not stale, f"SHARED_NAMES lists names no longer repeated: {stale}"


def layout_rows() -> list[list[str]]:
    """Each row of the Layout table as the backticked names of its first cell (the package) and
    of its last (the modules)."""
    rows = [line for line in section("Layout").splitlines() if line.startswith("| `")]
    assert len(rows) >= 10, "the Layout table changed shape"
    cells = [row.strip().strip("|").split("|") for row in rows]
    return [re.findall(r"`([^`]+)`", c[0]) + re.findall(r"`([^`]+)`", c[-1]) for c in cells]


def test_architecture_layout_matches_the_tree():
    missing, listed, named = [], set(), set()
    for names in layout_rows():
        package, modules = names[0], names[1:]
        if not (ROOT / package).exists():
            missing.append(package)
            continue
        listed.add(package.rstrip("/"))
        for module in modules:
            path = ROOT / package / module
            if module.endswith((".py", "/")) and not path.exists():
                missing.append(package.rstrip("/") + "/" + module)
            named.add(path.resolve())
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    packages = {str(p.parent.relative_to(ROOT)) for p in HONE.glob("*/__init__.py")}
    unlisted = sorted(packages - listed)
    assert not unlisted, f"docs/architecture.md's layout omits {unlisted}"
    unnamed = sorted(str(p.relative_to(ROOT)) for p in MODULES.values()
                     if p.resolve() not in named and p.name != "__init__.py")
    assert not unnamed, f"docs/architecture.md's layout does not name {unnamed}"
