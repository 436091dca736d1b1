"""SIGTERM/SIGINT handling of the loop (`_SignalFlag`): the first signal only raises the flag
(the loop saves at the next step boundary); with `checkpoint.grace_seconds` the process exits
if it has not stopped in time; a second signal exits at once."""

import os
import signal
import time

from hone.config import SFTConfig, load_config
from hone.errors import InputError
from hone.train.loop import _SignalFlag

import pytest


def test_first_signal_sets_the_flag_and_a_prompt_stop_cancels_the_grace_timer():
    exits = []
    with _SignalFlag(grace=0.2, exit=exits.append) as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert flag.raised == signal.SIGTERM
    time.sleep(0.4)
    assert exits == []


def test_grace_period_runs_out_then_the_process_exits(capfd):
    exits = []
    with _SignalFlag(grace=0.05, exit=exits.append):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # a step that outlasts the grace period
    assert exits == [1]
    assert "grace period of 0.05 s" in capfd.readouterr().err


def test_second_signal_exits_at_once_without_a_grace_period(capfd):
    exits = []
    with _SignalFlag(grace=None, exit=exits.append) as flag:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert exits == []
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
    assert flag.raised == signal.SIGINT and exits == [1]
    assert "second signal" in capfd.readouterr().err


def test_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with _SignalFlag(grace=1.0):
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before


def test_negative_grace_is_refused():
    with pytest.raises(InputError, match="checkpoint.grace_seconds"):
        load_config(SFTConfig, None, ["checkpoint.grace_seconds=-1"])
