"""What `hone eval` evaluates: a policy or a reward model from any source a user may name.

A policy source is anything `hone.load_model` takes (a preset, a Hugging Face folder, a .gguf
file) or a run folder (`config.yaml` + `checkpoints/`: its newest checkpoint, through
`hone.export.load_run_model`). A reward-model source is a folder written by
`hone export` of a reward run (or transformers' sequence-classification folder), or the reward
run folder itself. A load that fails becomes one InputError naming the flag to change.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from hone.errors import InputError

POLICY_SOURCES = ("a preset name (tiny, smollm2-135m-instruct, gemma3-270m, ...), a Hugging "
                  "Face folder, a .gguf file, or a run folder (config.yaml + checkpoints/)")
REWARD_SOURCES = ("a reward-model folder written by `hone export --run REWARD_RUN`, or the run "
                  "folder of `hone reward` itself")


def is_run_folder(source: str | Path) -> bool:
    """A folder some `hone <command>` wrote: config.yaml and checkpoints/."""
    path = Path(source)
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def load_policy(source: str | Path, dtype: str = "float32", flag: str = "--model"):
    """(Transformer, tokenizer) of a policy source; a run folder keeps its own dtype."""
    from hone.tokenizer import load_tokenizer
    from hone.weights.loading import load_model
    from hone.models.reward import RewardModel
    run = is_run_folder(source)
    try:
        if run:
            from hone.export import load_run_model
            model, tokenizer, _ = load_run_model(source)
        else:
            model, tokenizer = load_model(source, dtype=dtype), load_tokenizer(source)
    except InputError as err:
        hint = "" if run else f" Give {POLICY_SOURCES}."  # a run's own error says what to do
        raise InputError(f"cannot load this {'run' if run else 'model'} "
                         f"({detail(err, source)}).{hint}", path=str(source), key=flag) from err
    if isinstance(model, RewardModel):
        raise InputError("this run trained a reward model, which scores texts but does not "
                         "generate them; give it to --reward-model instead, and a policy "
                         f"({POLICY_SOURCES}) here", path=str(source), key=flag)
    return model, tokenizer


def load_reward(source: str | Path, flag: str = "--reward-model"):
    """(RewardModel, tokenizer) of a reward-model source."""
    from hone.tokenizer import load_tokenizer
    from hone.weights.hf_reward import load_reward_model
    from hone.export import load_run_model
    run = check_reward_source(source, flag)
    with _reward_errors(source, flag, run):
        if run:
            model, tokenizer, _ = load_run_model(source)
            return model, tokenizer
        return load_reward_model(source), load_tokenizer(source)


def reward_scorer(source: str | Path, *, batch_size: int = 16, max_length: int | None = None,
                  flag: str = "--reward-model"):
    """The RL `reward_model` reward (`hone.rl.reward_model_scorer.RewardModelScorer`) of a
    reward-model source: texts in, one float each out. A run folder is exported to a temporary
    folder first, since the scorer reads an exported folder (every tensor is copied into memory
    on load, so the folder can go right after)."""
    from hone.export import export_run
    from hone.rl.reward_model_scorer import RewardModelScorer
    run = check_reward_source(source, flag)
    with _reward_errors(source, flag, run):
        if not run:
            return RewardModelScorer(source, batch_size=batch_size, max_length=max_length)
        with tempfile.TemporaryDirectory() as tmp:
            folder = export_run(source, Path(tmp) / "reward", "hf")
            return RewardModelScorer(folder, batch_size=batch_size, max_length=max_length)


def check_reward_source(source: str | Path, flag: str = "--reward-model") -> bool:
    """The cheap checks of a reward-model source, before anything loads: True for a run folder
    of `hone reward`, False for another folder (an exported model); else an InputError."""
    with _reward_errors(source, flag, run=False):
        return _reward_run(Path(source))


def _reward_run(path: Path) -> bool:
    """True for a run folder of `hone reward`; an InputError for any other run folder or a
    path that is not a folder; False for a folder that is no run (an exported model)."""
    import yaml
    if not path.is_dir():
        raise InputError("no such folder")
    if not is_run_folder(path):
        return False
    sections = yaml.safe_load((path / "config.yaml").read_text()) or {}
    if "reward" not in sections:
        raise InputError("this run trained a policy, not a reward model")
    return True


@contextmanager
def _reward_errors(source, flag: str, run: bool):
    """Any InputError of loading becomes one naming the flag and, unless it is a reward run's
    own (which says what to do), the sources the flag takes."""
    try:
        yield
    except InputError as err:
        raise InputError(f"cannot load this {'run' if run else 'reward model'} "
                         f"({detail(err, source)})."
                         + ("" if run else f" Give {REWARD_SOURCES}."),
                         path=str(source), key=flag) from err


def detail(err: InputError, source) -> str:
    """An InputError's message without the place prefix when that place is `source` itself (the
    caller names it), and without a config key the command line never showed."""
    prefix = ": ".join(p for p in (err.path, None if err.key is None else f"'{err.key}'")
                       if p is not None)
    text = str(err)[len(prefix) + 2:] if prefix and str(err).startswith(prefix) else str(err)
    return text if err.path in (None, str(source)) else f"{err.path}: {text}"
