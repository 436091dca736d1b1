"""Training core: train state, optimizer, jitted step, generic loop."""
