"""The prompts of SFT-shaped records, for the model to answer: every turn of a chat but the last
assistant one, or a record's `prompt`, with the reference completion beside it.

Distillation's sequence mode has the teacher answer them and its evaluation compares the
student's and the teacher's greedy answers on them; both read them here, in data/, below both.
"""

from __future__ import annotations

from hone.data.loader import load_records
from hone.data.sft import Where, detect_format, parse_messages


def prompts_of(path: str, tokenizer, limit: int | None = None,
               records: list[dict] | None = None) -> tuple[list[str], list[str | None], list]:
    """(prompt texts ready to continue, reference completions or None, the prompt messages or
    prompt strings) of the records of `path`: chat `messages` (every turn but the last
    assistant one) or `prompt`/`completion`. Text-only records have no prompt: empty lists."""
    records = load_records(path, records, limit)
    fmt = detect_format(records[0], path, 0)
    prompts, refs, raw = [], [], []
    for index, record in enumerate(records):
        where = Where(path, index)
        if fmt == "messages":
            messages = parse_messages(record.get("messages"), where, "messages")
            if messages[-1]["role"] == "assistant":
                messages, ref = messages[:-1], messages[-1]["content"]
            else:
                ref = None
            prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
            refs.append(ref)
            raw.append(messages)
        elif fmt == "prompt_completion":
            prompt = where.string(where.field(record, "prompt"), "prompt")
            completion = record.get("completion")
            prompts.append(prompt)
            refs.append(completion if isinstance(completion, str) else None)
            raw.append(prompt)
        else:
            return [], [], []
    return prompts, refs, raw


