"""No loader in hone/ can run code from a file: no pickle anywhere, YAML read only by a SafeLoader.

A static scan of every module's syntax tree (comments and strings cannot hide or fake a hit):
- no import of pickle or its relatives (cPickle, dill, cloudpickle, joblib, shelve, marshal);
- no call that unpickles: `torch.load`, `pd.read_pickle`, `*.loads`/`*.load` of those modules,
  and no `allow_pickle=True` (numpy's `np.load` refuses pickles only by default);
- every `yaml.load`/`yaml.load_all` passes `Loader=` a SafeLoader (`yaml.SafeLoader`,
  `yaml.CSafeLoader`, or a class of the same module that derives from one), and nothing calls
  `yaml.unsafe_load`, `yaml.full_load` or names `yaml.Loader`, `FullLoader` or `UnsafeLoader`.
"""

from __future__ import annotations

import ast
from pathlib import Path

HONE = Path(__file__).resolve().parents[2] / "hone"
PICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader"}
UNSAFE_YAML = {"unsafe_load", "unsafe_load_all", "full_load", "full_load_all", "Loader",
               "FullLoader", "UnsafeLoader", "CLoader", "CFullLoader", "CUnsafeLoader"}


def _dotted(node: ast.AST) -> str:
    """`a.b.c` of a Name/Attribute chain, '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return ""


def _safe_classes(tree: ast.Module) -> set[str]:
    """Names of the module's classes that derive (here, transitively) from a SafeLoader."""
    safe: set[str] = set()
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for cls in classes:
            bases = {_dotted(b).rsplit(".", 1)[-1] for b in cls.bases}
            if cls.name not in safe and bases & (SAFE_LOADERS | safe):
                safe.add(cls.name)
                changed = True
    return safe


def _problems(path: Path, root: Path = HONE.parent) -> list[str]:
    """'file:line: what' for every unsafe loading form in one module (paths relative to root)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    safe = SAFE_LOADERS | _safe_classes(tree)
    found = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(root)}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLERS:
                    say(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in PICKLERS:
                say(node, f"imports from {node.module}")
            if node.module == "yaml" and {a.name for a in node.names} & (UNSAFE_YAML | {"load"}):
                say(node, "imports an unsafe YAML loader or a bare load")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "yaml" and node.attr in UNSAFE_YAML:
                say(node, f"uses yaml.{node.attr}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.endswith(("torch.load", "read_pickle")) or name.split(".")[0] in PICKLERS:
                say(node, f"calls {name}")
            for kw in node.keywords:
                if kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant)
                                                     and kw.value.value is False):
                    say(node, f"calls {name or 'something'} with allow_pickle")
            if name in ("yaml.load", "yaml.load_all"):
                loader = next((kw.value for kw in node.keywords if kw.arg == "Loader"),
                              node.args[1] if len(node.args) > 1 else None)
                if loader is None or _dotted(loader).rsplit(".", 1)[-1] not in safe:
                    say(node, f"calls {name} without a SafeLoader")
    return found


def test_the_scan_finds_unsafe_loading(tmp_path):
    """The scanner itself: each forbidden form is caught, the safe forms are not."""
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nfrom dill import loads\nimport yaml, numpy as np, torch\n"
                   "yaml.load(t)\nyaml.load(t, Loader=yaml.Loader)\nyaml.unsafe_load(t)\n"
                   "np.load(f, allow_pickle=True)\ntorch.load(f)\nclass L(yaml.FullLoader): pass\n"
                   "yaml.load(t, Loader=L)\n")
    good = tmp_path / "good.py"
    good.write_text("import yaml, numpy as np\nclass A(yaml.SafeLoader): pass\nclass B(A): pass\n"
                    "yaml.load(t, Loader=B)\nyaml.safe_load(t)\nnp.load(f)\n"
                    "np.load(f, allow_pickle=False)\n# import pickle\ns = 'pickle.load'\n")
    assert len(_problems(bad, tmp_path)) == 10, _problems(bad, tmp_path)
    assert _problems(good, tmp_path) == []


def test_no_unsafe_loading_in_hone():
    files = sorted(HONE.rglob("*.py"))
    assert len(files) > 20  # the scan sees the package
    problems = [p for f in files for p in _problems(f)]
    assert not problems, "unsafe loading:\n" + "\n".join(problems)
