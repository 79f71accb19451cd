"""Pictures and experiments: loss curves, attention maps, position schemes, measured studies."""
