#!/usr/bin/env bash
# Installs hone into a fresh virtual environment from pyproject.toml's ranges alone (no lock), the
# way a user beside other packages or on another machine installs it, then imports it, runs
# `hone doctor` and one tiny compiled step. Needs the network (PyPI); takes minutes, so `make test`
# does not run it (tests/test_install.py runs it only with HONE_CHECK_INSTALL=1).
#
#   scripts/check_install.sh            # ranges alone, PyPI only
#   scripts/check_install.sh --lock     # the same with `-c requirements/lock.txt` (make's set)
#
# PyPI only: this machine's pip configuration (extra indexes, local wheels, constraints) is set
# aside, so what resolves here resolves on a plain machine. HONE_CHECK_VENV=DIR keeps the venv
# in DIR (default: a temporary folder, removed afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

lock=()
if [[ "${1:-}" == "--lock" ]]; then
  lock=(-c "$repo/requirements/lock.txt")
fi

venv=${HONE_CHECK_VENV:-}
if [[ -z "$venv" ]]; then
  venv=$(mktemp -d "${TMPDIR:-/tmp}/hone-check-install.XXXXXX")
  trap 'rm -rf "$venv"' EXIT
fi

export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT PIP_NO_INDEX || true
start=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# Non-editable: the installed package must carry everything it needs (kernel sources included).
"$venv/bin/python" -m pip install -q "${lock[@]}" "$repo"
installed=$(date +%s)
echo "check_install: installed in $((installed - start)) s"
"$venv/bin/python" -m pip list --format=freeze | grep -iE '^(jax|jaxlib|flax|optax|orbax-checkpoint|numpy)=='

# Run from outside the repo so the installed hone is imported, not the checkout's.
cd "$venv"
"$venv/bin/python" -c "import hone, hone.cli; print('check_install: imported', hone.__file__)"
"$venv/bin/hone" doctor --lock "$repo/requirements/lock.txt"
JAX_PLATFORMS=cpu "$venv/bin/hone" bench sft --model tiny --steps 1 --batch 2 --seq 16 | tail -1
echo "check_install: ok in $(( $(date +%s) - start )) s"
