"""The one spelling of a parameter's or module's name: its nnx path joined with "/".

"layers/3/attn/q/kernel" names a parameter in the train state's flat dicts, in checkpoints, in the
sharding layout and in LoRA's target patterns alike. It lives with the model, the lowest floor
that has paths, so parallel/ (placement) and train/ (the state) spell it the same way without
importing each other.
"""

from __future__ import annotations


def path_key(path: tuple) -> str:
    """("layers", 3, "attn", "q", "kernel") -> "layers/3/attn/q/kernel"."""
    return "/".join(str(p) for p in path)
