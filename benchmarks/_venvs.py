"""Separate virtual environments for the libraries hone is measured against.

`tunix_python()` creates `benchmarks/.venvs/tunix` on first use (python3 -m venv, then pip install
of TUNIX_PINS) and returns the path of its python. Later calls only check that the pinned Tunix is
importable there, so it is cheap and idempotent. The folder is git-ignored.

    python benchmarks/_venvs.py        # create (if missing) and print the interpreter path
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"

# What `pip install google-tunix==0.1.7` resolved to on the 2-core CPU machine; the packages the
# vanilla Sampler and the Llama3 model actually import are pinned so reruns measure the same code.
TUNIX_PINS = (
    "google-tunix==0.1.7",
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "numpy==2.4.6",
    "ml_dtypes==0.6.0",
    "jaxtyping==0.3.11",
    "sentencepiece==0.2.3",
    "qwix==0.1.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "transformers==5.12.1",
)
TUNIX_VERSION = "0.1.7"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _ready(python: Path) -> bool:
    if not python.exists():
        return False
    check = ("import importlib.metadata as m, tunix.generate.sampler, tunix.models.llama3.model; "
             f"assert m.version('google-tunix') == {TUNIX_VERSION!r}")
    r = subprocess.run([str(python), "-c", check], capture_output=True, text=True)
    return r.returncode == 0


def tunix_python(venv: Path | None = None, quiet: bool = False) -> Path:
    """The python of the Tunix venv, creating and filling it first if needed."""
    venv = Path(venv) if venv is not None else VENVS / "tunix"
    python = _python(venv)
    if _ready(python):
        return python
    say = (lambda *_: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if venv.exists() and not python.exists():
        shutil.rmtree(venv)  # a half-made venv without an interpreter: start over
    if not python.exists():
        say(f"[venvs] creating {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    say(f"[venvs] pip install {' '.join(TUNIX_PINS)} (takes a couple of minutes)")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *TUNIX_PINS], check=True)
    if not _ready(python):
        raise RuntimeError(f"Tunix {TUNIX_VERSION} is still not importable with {python}")
    return python


if __name__ == "__main__":
    print(tunix_python())
