"""Hand-written kernels for where XLA's own are slow (compiled on first use: build.py)."""
