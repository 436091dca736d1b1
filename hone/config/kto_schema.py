"""The configuration of `hone kto`: unpaired examples labelled desirable or undesirable (KTO,
Ethayarajh et al. 2024), the loss's weights, and its reference model.

Design choices:
- `data:` is DataSection plus `from_pairs`, a key only this command has (so the other commands
  still reject it). The defaults train on the bundled preference pairs through `from_pairs`,
  so an empty config runs, as every other command's does.
- The reference modes are DPO's (`hone.train.reference`); KTO always reads a reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hone.config.schema import DataSection, TrainConfig
from hone.errors import InputError


@dataclass(frozen=True)
class KTODataSection(DataSection):
    """DataSection with KTO's defaults as the class's own (the loader builds a section from its
    class whenever a file or an override sets any of its keys), plus `from_pairs`."""

    # Training records: a JSONL or Parquet file, a saved `datasets` folder, or "builtin:NAME".
    path: str = "builtin:arithmetic-pref"
    # Evaluation records, same forms; None = no evaluation.
    eval_path: str | None = "builtin:arithmetic-pref-eval"
    # Read preference pairs (prompt + chosen + rejected) as KTO data: each pair gives a
    # desirable example (chosen) and an undesirable one (rejected). false: records are
    # prompt + completion + label (true = desirable).
    from_pairs: bool = True


@dataclass(frozen=True)
class KTOSection:
    # Strength of the implicit reward beta * (log pi - log pi_ref).
    beta: float = field(default=0.1, metadata={"gt": 0.0})
    # Weight of the desirable examples' losses (lambda_D).
    desirable_weight: float = field(default=1.0, metadata={"gt": 0.0})
    # Weight of the undesirable examples' losses (lambda_U). The paper recommends
    # desirable_weight * n_desirable / (undesirable_weight * n_undesirable) in [1, 4/3]; the
    # run logs where the training data stands.
    undesirable_weight: float = field(default=1.0, metadata={"gt": 0.0})
    # Where reference log-probabilities come from: "copy" (a frozen copy of the starting
    # weights), "adapters_off" (the base with LoRA switched off; needs model.lora.rank > 0),
    # "precomputed" (one pass over the data before training, cached in
    # run_dir/reference_logps.npz), or "auto" (adapters_off with LoRA, else copy).
    reference: str = field(default="auto", metadata={
        "choices": ("auto", "copy", "adapters_off", "precomputed")})


@dataclass(frozen=True)
class KTOConfig(TrainConfig):
    """`hone kto`: KTO on examples labelled desirable or undesirable."""

    # Records: prompt + completion + label, or preference pairs with from_pairs.
    data: KTODataSection = field(default_factory=KTODataSection)
    # The KTO loss and its reference model.
    kto: KTOSection = field(default_factory=KTOSection)

    def __post_init__(self):
        super().__post_init__()
        if self.kto.reference == "adapters_off" and self.model.lora.rank == 0:
            raise InputError("switching adapters off needs adapters: set model.lora.rank > 0, "
                             "or kto.reference to copy or precomputed", key="kto.reference")
        if self.data.pack:
            raise InputError("KTO scores each example's completion on its own row; packing is "
                             "not supported", key="data.pack")
