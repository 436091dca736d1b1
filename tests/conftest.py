"""Shared test set-up: tests/ is importable (reference models), and JAX stays quiet."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
