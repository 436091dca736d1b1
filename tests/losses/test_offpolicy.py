"""hone.losses.rl.offpolicy_weights by hand: truncated importance weights, IcePop's token band,
the sequence band on the geometric-mean ratio, and the k3 estimate of the sampler/trainer gap."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from hone.config import GRPOConfig, load_config
from hone.errors import InputError
from hone.losses.rl import offpolicy_weights

# Two samples of three slots; the second's last slot is padding.
LOG_R = np.array([[0.0, math.log(3.0), math.log(0.25)],
                  [math.log(1.05), math.log(1.1), 7.0]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
SAMPLER = np.full((2, 3), -1.0, np.float32)
OLD = SAMPLER + LOG_R


def weights(**kw):
    w, m = offpolicy_weights(jnp.asarray(OLD), jnp.asarray(SAMPLER), jnp.asarray(MASK), **kw)
    return (None if w is None else np.asarray(w)), {k: float(v) for k, v in m.items()}


def test_no_correction_gives_no_weights_but_the_gap_metrics():
    w, m = weights()
    assert w is None
    r = np.exp(LOG_R) * MASK
    k3 = sum(r[i, j] - 1 - LOG_R[i, j] for i in range(2) for j in range(3) if MASK[i, j])
    assert m["offpolicy_k3_sum"] == pytest.approx(k3, rel=1e-5)
    assert (m["tis_clipped_sum"], m["token_masked_sum"], m["seq_masked_sum"], m["seqs"]) == \
        (0, 0, 0, 2)


def test_truncated_importance_weights():
    w, m = weights(tis_cap=2.0)
    np.testing.assert_allclose(w[0], [1.0, 2.0, 0.25], rtol=1e-6)
    np.testing.assert_allclose(w[1, :2], [1.05, 1.1], rtol=1e-6)
    assert m["tis_clipped_sum"] == 1  # the 3 (the padding's 7 is not a token)


def test_icepop_masks_tokens_outside_the_band():
    w, m = weights(token_band=(0.5, 2.0))
    np.testing.assert_array_equal(w[0], [1.0, 0.0, 0.0])  # 3 and 0.25 are outside
    np.testing.assert_array_equal(w[1, :2], [1.0, 1.0])
    assert m["token_masked_sum"] == 2 and m["seq_masked_sum"] == 0


def test_sequence_band_masks_whole_samples_by_their_geometric_mean_ratio():
    # sample 0: (1 * 3 * 0.25) ** (1/3) = 0.909; sample 1: (1.05 * 1.1) ** (1/2) = 1.0747
    w, m = weights(seq_band=(0.95, 1.05))
    np.testing.assert_array_equal(w[0], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(w[1, :2], [0.0, 0.0])
    assert m["seq_masked_sum"] == 2 and m["token_masked_sum"] == 5
    w, m = weights(seq_band=(0.9, 1.08), tis_cap=2.0)
    np.testing.assert_allclose(w[0], [1.0, 2.0, 0.25], rtol=1e-6)  # 0.909 and 1.075 inside
    assert m["seq_masked_sum"] == 0


@pytest.mark.parametrize("band", ["[2.0]", "[1.2, 2.0]", "[0.5, 0.9]"])
def test_a_band_that_does_not_hold_1_is_refused(band, tmp_path):
    with pytest.raises(InputError, match="icepop_band"):
        load_config(GRPOConfig, None, [f"run_dir={tmp_path}", f"grpo.icepop_band={band}"])
