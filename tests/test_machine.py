"""scripts/machine.py names the machine a timing was taken on (the line `make test` starts with)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "machine.py"


def test_machine_line_names_cpu_vector_extensions_and_cores():
    spec = importlib.util.spec_from_file_location("machine", SCRIPT)
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    line = machine.cpu()
    assert "cores" in line and any(v in line for v in ("AVX-512", "AVX2", "no AVX2")), line
