"""Vision towers, connectors and the vision-language models built on hone's one transformer."""
