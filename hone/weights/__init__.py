"""Weight formats: Hugging Face safetensors folders and GGUF files in, Hugging Face folders and
PEFT adapters out, the shipped models, and loading any model source."""
