"""The documentation stays true to the code: commands name real configs, keys are real keys, links
resolve.

Pure text checks (no JAX, no training), so the file runs in well under a second:
- every `hone <command> --config PATH` in README.md and docs/ names a real command and an existing
  config file (or one of the user-file placeholders docs/scale-out.md shows), and every
  `section.key=value` override written after it is a key of docs/configuration.md;
- every dotted config key written in backticks in README.md and docs/ (`dpo.beta`,
  `grpo.scale=none`) is a key (or a section such as `model.lora`) of docs/configuration.md, and
  every `--flag` of a hone command line in the guides is a flag the command line defines;
- every relative Markdown link in README.md and docs/ points at an existing file, and every
  repository path written in backticks (`hone/models/lora.py`, `tests/x.py::test_y`) exists (the
  test too);
- the guides index links every guide, and README.md links the index, the comparison page, the
  architecture overview and the API reference.

docs/configuration.md is itself generated from the schema and checked against it by
tests/config/test_reference.py, so a key it lists is a key the config loader accepts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = DOCS / "guides"
README = ROOT / "README.md"
REFERENCE = DOCS / "configuration.md"

# Config files that a doc shows as the reader's own (docs/scale-out.md writes them out), not
# files of this repository. Add a name here only when the doc shows or describes that file.
# FILE is the placeholder of the command synopsis in docs/api.md.
USER_FILES = {"my.yaml", "pod.yaml", "cluster.yaml", "FILE"}

# A backticked dotted word that ends in one of these is a file name, not a config key
# (`reward.py`, `model.safetensors.index.json`).
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "npz", "npy", "safetensors", "gguf",
                 "html", "png", "txt", "parquet", "arrow", "jinja", "gz"}

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMAND = re.compile(r"\bhone\s+([\w-]+)\s+--config[ =]([^\s`]+)([^\n`#]*)")
DOTTED = re.compile(r"^[a-z_]+(?:\.[a-z0-9_]+)+$")
REPO_PATH = re.compile(r"^(?:hone|tests|configs|benchmarks|scripts|docs)/[\w./-]*(?:::\w+)?$")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def config_keys() -> set[str]:
    """The keys of docs/configuration.md: the first cell of each table row, e.g. `dpo.beta`."""
    keys = set(re.findall(r"^\| `([a-z_][\w.]*)` \|", REFERENCE.read_text(), re.M))
    assert {"run_dir", "model.source", "train.max_steps", "dpo.beta"} <= keys, "reference changed shape"
    return keys


def sections(keys: set[str]) -> set[str]:
    return {k.split(".")[0] for k in keys if "." in k}


def subsections(keys: set[str]) -> set[str]:
    """Section names written with a dot (`model.lora`): every proper prefix of a key."""
    return {".".join(k.split(".")[:i]) for k in keys for i in range(2, k.count(".") + 1)}


def commands() -> set[str]:
    """Command names registered in hone/cli.py (read as text: nothing is imported)."""
    cli = (ROOT / "hone" / "cli.py").read_text()
    names = set(re.findall(r'_add_train_command\(sub, "(\w+)"', cli))
    names |= set(re.findall(r'sub\.add_parser\("(\w+)"', cli))
    names |= {"eval"}  # registered by hone/eval/command.py's add_eval_parser
    assert {"sft", "dpo", "reward", "grpo", "ppo", "distill", "export", "report"} <= names
    return names


def cli_flags() -> set[str]:
    text = "".join((ROOT / "hone" / f).read_text()
                   for f in ("cli.py", "eval/command.py", "bench/command.py", "plan/command.py"))
    return set(re.findall(r'add_argument\(\s*"(--[\w-]+)"', text))


def prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return FENCE.sub("", text)


def key_of(token: str, known_sections: set[str]) -> str | None:
    """The config key a backticked token or command-line override names, or None if it names
    none (a file, a module path, a metric)."""
    lhs = token.strip("'\"").split("=", 1)[0]
    if not DOTTED.match(lhs) or lhs.split(".")[0] not in known_sections:
        return None
    if lhs.rsplit(".", 1)[-1] in FILE_SUFFIXES:
        return None
    return lhs


def test_config_paths_and_overrides_in_commands_exist():
    keys, names = config_keys(), commands()
    problems = []
    for doc in doc_files():
        for cmd, path, rest in COMMAND.findall(doc.read_text()):
            path = path.strip("'\"`),.;:")
            where = f"{rel(doc)}: hone {cmd} --config {path}"
            if cmd not in names:
                problems.append(f"{where}: no command {cmd!r}")
            if not (ROOT / path).is_file() and path not in USER_FILES:
                problems.append(f"{where}: no such file")
            if cmd == "pipeline":  # its overrides are STAGE.section.key=value
                continue
            for token in rest.split():
                token = token.strip("'\"")
                if "=" in token and re.match(r"^[a-z_][\w.]*=", token):
                    lhs = token.split("=", 1)[0]
                    if lhs not in keys:
                        problems.append(f"{where}: unknown key {lhs!r}")
    assert not problems, "\n".join(problems)


def test_backticked_config_keys_exist():
    keys = config_keys()
    known, names = sections(keys), keys | subsections(keys)
    problems = []
    for doc in doc_files():
        for span in CODE_SPAN.findall(prose(doc.read_text())):
            for token in span.split():
                key = key_of(token, known)
                if key is not None and key not in names:
                    problems.append(f"{rel(doc)}: `{span}` names no key of docs/configuration.md")
    assert not problems, "\n".join(problems)


def test_flags_of_hone_commands_in_guides_exist():
    """`--flags` of the hone command lines in the guides (code blocks and spans), and lone
    backticked flags (`--format`); a benchmark script's own flags are not checked."""
    flags = cli_flags()
    assert {"--config", "--run", "--out", "--format", "--model"} <= flags
    problems = []
    for doc in sorted(GUIDES.glob("*.md")):
        text = doc.read_text()
        spans = [m.group(0).strip("`") for m in FENCE.finditer(text)]
        spans += CODE_SPAN.findall(prose(text))
        lines = [line for span in spans for line in span.splitlines()]
        for line in lines:
            tokens = line.split("#", 1)[0].split()
            if not tokens or not (tokens[0] == "hone" or len(tokens) == 1):
                continue
            for token in tokens:
                flag = token.split("=", 1)[0]
                if flag.startswith("--") and flag not in flags:
                    problems.append(f"{rel(doc)}: `{line.strip()}`: no flag {flag}")
    assert not problems, "\n".join(problems)


def test_relative_links_resolve():
    problems = []
    for doc in doc_files():
        for target in LINK.findall(prose(doc.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http:, https:, mailto:, an anchor in the same page
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                problems.append(f"{rel(doc)}: link to {target} does not resolve")
    assert not problems, "\n".join(problems)


def test_backticked_repository_paths_exist():
    """A path such as `hone/checkpoint/manifest.py` or `tests/train/test_resume.py::test_x`
    written in a doc names a file (and a test in it) that exists."""
    problems = []
    for doc in doc_files():
        for span in CODE_SPAN.findall(prose(doc.read_text())):
            for token in span.split():
                token = token.strip("(),;:'\"")
                if not REPO_PATH.match(token):
                    continue
                path, _, test = token.partition("::")
                if not (ROOT / path).exists():
                    problems.append(f"{rel(doc)}: `{token}`: no such path")
                elif test and not re.search(rf"^\s*def {test}\(", (ROOT / path).read_text(), re.M):
                    problems.append(f"{rel(doc)}: `{token}`: no test {test} in {path}")
    assert not problems, "\n".join(problems)


def test_guides_are_linked():
    index = (GUIDES / "index.md").read_text()
    linked = set(LINK.findall(index))
    missing = [g.name for g in sorted(GUIDES.glob("*.md"))
               if g.name != "index.md" and g.name not in linked]
    assert not missing, f"docs/guides/index.md does not link {missing}"
    readme_links = set(LINK.findall(README.read_text()))
    for page in ("docs/guides/index.md", "docs/comparison.md", "docs/architecture.md",
                 "docs/api.md"):
        assert page in readme_links, f"README.md does not link {page}"


@pytest.mark.parametrize("algo", ["sft", "dpo", "kto", "reward", "grpo", "ppo", "distill"])
def test_each_guide_runs_its_tiny_config(algo):
    text = (GUIDES / f"{algo}.md").read_text()
    assert f"hone {algo} --config configs/tiny/{algo}.yaml" in text
    for smollm2 in sorted((ROOT / "configs" / "smollm2").glob("*.yaml")):
        if smollm2.stem.split("_")[0] == algo:
            assert f"configs/smollm2/{smollm2.name}" in text, f"{algo}.md omits {smollm2.name}"
