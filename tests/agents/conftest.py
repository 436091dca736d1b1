"""Fixtures of the agent tests."""

import pytest

from hone.models.loading import load_model, load_tokenizer


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=3), load_tokenizer("tiny")
