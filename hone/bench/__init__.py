"""hone's own speed measurement: `hone bench ROW` and the hone side of benchmarks/.

- `timing.py`: the first-call-then-median clock and peak RSS (standard library only; the Tunix
  benchmark scripts load it too, so every implementation is timed by the same code);
- `flops.py`: model FLOPs per step of each row (what MFU divides), formulas in its docstring;
- `rows.py`: the sft, lora, dpo and decode rows; `grpo.py`: the GRPO row. Each builds exactly
  what the matching hone command runs and returns a `Measured`;
- `command.py`: the command's options, the default shapes (those of benchmarks/RESULTS.md),
  the matmul ceiling and the JSON line.

benchmarks/*_hone.py are thin wrappers over the rows, for the side-by-side drivers.
"""
