"""Built-in task plugins (training data): one module per task, registered under the module's name."""
