"""hone.data.kto: each example's KL partner has another prompt, the KL rows hold the example's
prompt and the partner's completion, and over-long examples follow data.overlong."""

import numpy as np

from hone.data.kto import Example, KTOData, partners
from hone.tokenizer import load_tokenizer


def example(prompt):
    return Example(np.array(prompt, np.int32), np.array([9], np.int32), True)


def test_partner_is_the_next_example_with_another_prompt():
    # Runs of equal prompts: [1] [1] | [2] | [1] | [3] [3]; the last run wraps to the first.
    ex = [example(p) for p in ([1], [1], [2], [1], [3], [3])]
    assert partners(ex) == [2, 2, 3, 4, 0, 0]
    # Every prompt the same: the next example, for lack of another prompt.
    assert partners([example([5])] * 3) == [1, 2, 0]
    # A last run whose wrap lands on its own prompt goes on to the next that differs.
    assert partners([example(p) for p in ([1], [2], [1])]) == [1, 2, 1]


def test_kl_rows_pair_each_prompt_with_its_partners_completion():
    tok = load_tokenizer("tiny")
    records = [{"prompt": "2 + 2?", "completion": "4", "label": True},
               {"prompt": "3 + 3?", "completion": "7", "label": False},
               {"prompt": "3 + 3?", "completion": "6", "label": True}]
    data = KTOData("k.jsonl", tok, records=records, batch_size=3)
    assert (data.num_desirable, data.num_undesirable) == (2, 1)
    batch = next(iter(data.batches()))
    assert batch["tokens"].shape[0] == 6 and list(batch["desirable"]) == [1.0, 0.0, 1.0]

    def text(row, mask=False):
        ids = batch["targets"][row][batch["loss_mask"][row] > 0] if mask else [
            t for t in batch["tokens"][row] if t != tok.pad_id]
        return tok.decode([int(t) for t in ids])

    # Completion spans: the examples' own, then their partners' (4 -> 7, 7 -> 4, 6 -> 4).
    assert [text(r, mask=True)[0] for r in range(6)] == ["4", "7", "6", "7", "4", "4"]
    assert "3 + 3?" in text(4) and "2 + 2?" in text(3)  # each KL row keeps its own prompt


def test_overlong_examples_truncate_or_drop():
    tok = load_tokenizer("tiny")
    records = [{"prompt": "q" * 40, "completion": "a" * 30, "label": True},
               {"prompt": "short", "completion": "b", "label": False}]
    cut = KTOData("k.jsonl", tok, records=records, max_length=48)
    assert cut.stats.truncated == 1 and int(cut.pairs["attention_mask"].sum(-1).max()) <= 48
    dropped = KTOData("k.jsonl", tok, records=records, max_length=48, overlong="drop")
    assert dropped.stats.dropped_overlong == 1 and dropped.num_pairs == 1
