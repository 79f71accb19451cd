"""Built-in Hugging Face converters: one module per ``model_type``, registered under its name."""
