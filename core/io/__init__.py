"""Models in and out: building from recipes, safetensors checkpoints, Hugging Face folders."""
