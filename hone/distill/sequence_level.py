"""Sequence-level distillation (Kim & Rush 2016): the teacher answers every training prompt once,
and the student is fine-tuned on those answers with the SFT loss.

The teacher's data is run_dir/teacher_data.jsonl, in the records' own format (chat `messages`
whose last assistant turn is the teacher's, or `prompt`/`completion`), written under a temporary
name and renamed when complete: a resumed run reuses it and trains on exactly the same data; a
run killed while generating starts the generation again. Generation is seeded (train.seed), so
a fresh run with the same settings writes the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

from hone.data.sft_prompts import prompts_of
from hone.errors import InputError

FILE = "teacher_data.jsonl"


def teacher_dataset(cfg, teacher, tokenizer, run_dir: Path, *, batch_size: int = 32,
                    log=print) -> Path:
    """The path of the teacher-written training records (generated first if missing)."""
    from hone.sampling.generate import generate
    out = Path(run_dir) / FILE
    if out.exists():
        log(f"sequence distillation: reusing {out}")
        return out
    d = cfg.data
    prompts, _, raw = prompts_of(d.path, tokenizer, d.max_records)
    if not prompts:
        raise InputError("sequence-level distillation needs prompts: records with `messages` "
                         "or `prompt`/`completion`, not plain text", path=d.path)
    tmp = out.with_name(FILE + ".partial")
    from hone.sampling.paged import rollout_engine
    kw = dict(max_new_tokens=cfg.distill.max_new_tokens,
              temperature=cfg.distill.gen_temperature,
              engine=rollout_engine(cfg.distill.engine), max_seqs=cfg.distill.max_seqs)
    with tmp.open("w") as f:
        for start in range(0, len(prompts), batch_size):
            outs = generate(teacher, tokenizer, prompts[start:start + batch_size],
                            seed=cfg.train.seed + start, **kw)
            for prompt, o in zip(raw[start:start + batch_size], outs):
                text = o.text.strip()
                if isinstance(prompt, str):
                    record = {"prompt": prompt, "completion": text}
                else:
                    record = {"messages": prompt + [{"role": "assistant", "content": text}]}
                f.write(json.dumps(record) + "\n")
            log(f"sequence distillation: the teacher answered {min(start + batch_size, len(prompts))}"
                f"/{len(prompts)} prompts")
    tmp.rename(out)
    return out
