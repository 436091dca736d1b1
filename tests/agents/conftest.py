"""Fixtures of the agent tests."""

import glob
import os
import signal
import subprocess
import tempfile
import types

import pytest
from code_host import leftovers

from hone.agents import code_tool
from hone.tokenizer import load_tokenizer

from hone.weights.loading import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=3), load_tokenizer("tiny")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The host's state before a code run, checked after it: the process group (a canary
    process in it), a file and folder outside the run's folder, SIGUSR1 never delivered, no
    folders left. The tool's run folders go under this test's own temporary folder, so what
    another pytest worker runs at the same time is not taken for a leftover."""
    root = str(tmp_path / "runs")
    os.mkdir(root)
    monkeypatch.setattr(code_tool, "tempfile", types.SimpleNamespace(
        mkdtemp=lambda **kw: tempfile.mkdtemp(dir=root, **kw)))
    received = []
    old = signal.signal(signal.SIGUSR1, lambda *a: received.append(1))
    canary = subprocess.Popen(["sleep", "60"])  # in this process's group
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("original")
    folders = set(glob.glob(os.path.join(root, "hone-code-*")))
    yield {"outside": str(outside), "pid": os.getpid(), "pgid": os.getpgid(0)}
    try:
        assert canary.poll() is None, "a process in the host's group was killed"
        assert received == [], "a signal reached the host"
        assert sorted(os.listdir(outside)) == ["keep.txt"]
        assert (outside / "keep.txt").read_text() == "original"
        assert set(glob.glob(os.path.join(root, "hone-code-*"))) <= folders
        assert leftovers(root) == []
    finally:
        canary.kill()
        canary.wait()
        signal.signal(signal.SIGUSR1, old)
