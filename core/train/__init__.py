"""Training on tasks, and the conformance kit that checks components against their contracts."""
