"""Built-in optimizer plugins: one module per optimizer, registered under the module's name."""
