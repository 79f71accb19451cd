"""Built-in rope_scaling plugins: one module per variant, registered under the module's name."""
