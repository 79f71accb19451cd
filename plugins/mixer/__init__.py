"""Built-in mixer plugins: one module per variant, registered under the module's name."""
