"""Data in: sources (files, folders, bundled sets), tokenization with loss masks, padding and
packing into fixed-shape rows, and resumable batch iterators. See each module's docstring."""
