"""pyproject.toml's ranges, requirements/lock.txt's exact set and the environment agree.

pyproject declares compatible ranges; the lock picks one version inside each and is what the
Makefile installs (`pip install -c`), so `make test` runs on exactly the locked set. Fast and
offline: the files are parsed with `packaging`, the environment read with importlib.metadata.
The real install from the ranges alone needs PyPI and minutes: scripts/check_install.sh, run
here only with HONE_CHECK_INSTALL=1 (marker `network`).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from hone.doctor import read_lock

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements() -> dict[str, list[Requirement]]:
    """"runtime" and each extra -> its requirements."""
    p = project()
    return {"runtime": [Requirement(r) for r in p["dependencies"]],
            **{extra: [Requirement(r) for r in reqs]
               for extra, reqs in p["optional-dependencies"].items()}}


def test_the_lock_satisfies_every_range():
    pins = read_lock(LOCK)
    outside = [f"{group}: {req} but locked {pins[canonicalize_name(req.name)]}"
               for group, reqs in requirements().items() for req in reqs
               if canonicalize_name(req.name) in pins
               and not req.specifier.contains(pins[canonicalize_name(req.name)])]
    assert not outside, outside


def test_the_lock_pins_every_runtime_and_test_requirement():
    pins = read_lock(LOCK)
    groups = requirements()
    unpinned = [str(r) for r in groups["runtime"] + groups["test"]
                if canonicalize_name(r.name) not in pins]
    assert not unpinned, f"requirements/lock.txt has no version for {unpinned}"


# Narrower ceilings, each with its reason. hone/checkpoint/manifest.py re-implements a private
# function of Orbax 0.12.8 (orbax.checkpoint._src) to finalize a checkpoint itself, which a patch
# release may change: only the tested release is allowed.
NARROW = {"orbax-checkpoint": "0.12.9"}
# Wider ceilings, each with its reason. jax and jaxlib reach the releases that accelerator images
# carry (0.11.x with the CUDA 13 plugin on the lent H200, 0.12.x the newest), so hone installs
# there with `pip install --no-deps -e .` beside the image's own JAX without being out of range;
# the lock stays at the newest release this machine's package index serves (0.10.2).
WIDE = {"jax": "0.13", "jaxlib": "0.13"}


def test_ranges_are_ranges_up_to_the_next_breaking_release():
    """Floor = the tested version; ceiling = the next minor for 0.x, else the next major
    (NARROW, WIDE: a named reason for less or more)."""
    pins = read_lock(LOCK)
    wrong = []
    for group, reqs in requirements().items():
        for req in reqs:
            floor = [s.version for s in req.specifier if s.operator == ">="]
            ceiling = [s.version for s in req.specifier if s.operator == "<"]
            if len(req.specifier) != 2 or not floor or not ceiling:
                wrong.append(f"{group}: {req} is not >=floor,<ceiling")
                continue
            major, minor = (int(x) for x in floor[0].split(".")[:2])
            want = f"0.{minor + 1}" if major == 0 else f"{major + 1}"
            name = canonicalize_name(req.name)
            want = NARROW.get(name, WIDE.get(name, want))
            if ceiling[0] != want:
                wrong.append(f"{group}: {req} should end below {want}")
            locked = pins.get(canonicalize_name(req.name))
            if locked is not None and floor[0] != locked.split("+")[0]:
                wrong.append(f"{group}: {req}'s floor is not the locked {locked}")
    assert not wrong, wrong


def test_the_accelerator_extras_pull_jax_builds_of_the_same_range():
    groups = requirements()
    jax = next(r for r in groups["runtime"] if r.name == "jax")
    for extra, build in (("cuda12", "cuda12"), ("cuda13", "cuda13"), ("tpu", "tpu")):
        (req,) = groups[extra]
        assert (req.name, req.extras, req.specifier) == ("jax", {build}, jax.specifier)


def test_this_environment_holds_exactly_the_locked_versions():
    """The environment the suite runs in is the locked set (2.13.0+cpu satisfies ==2.13.0)."""
    wrong = []
    for name, version in read_lock(LOCK).items():
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            wrong.append(f"{name}: not installed, locked {version}")
            continue
        if not SpecifierSet(f"=={version}").contains(have, prereleases=True):
            wrong.append(f"{name}: installed {have}, locked {version}")
    assert not wrong, wrong


def test_every_pip_install_of_the_makefile_uses_the_lock():
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^PIP := \$\(PY\) -m pip install -q -c \$\(LOCK\)$", text, re.M)
    assert re.search(r"^LOCK := requirements/lock\.txt$", text, re.M)
    installs = [line.strip() for line in text.splitlines()
                if "pip install" in line and not line.startswith(("PIP :=", "#"))]
    # The one exception: pip itself, before anything is installed with it.
    assert installs == ["$(PY) -m pip install -q --upgrade pip"], installs
    # make demo installs no test extra; make test installs them.
    demo = re.search(r"^\$\(DEMO_STAMP\):.*?(?=^\S)", text, re.S | re.M).group(0)
    assert "$(PIP) -e .\n" in demo and "[test]" not in demo
    assert "$(PIP) -e '.[test]'" in text


@pytest.mark.network
@pytest.mark.skipif(os.environ.get("HONE_CHECK_INSTALL") != "1",
                    reason="installs from PyPI into a fresh venv (minutes): HONE_CHECK_INSTALL=1")
def test_hone_installs_from_the_ranges_alone():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "check_install.sh")],
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "check_install: ok" in out.stdout
