"""Built-in learning-rate schedule plugins: one module per schedule, registered under the module's name."""
