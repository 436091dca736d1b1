"""Fixtures of the agent tests."""

import pytest

from hone.tokenizer import load_tokenizer

from hone.weights.loading import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=3), load_tokenizer("tiny")
