"""The neural-network machinery: attention and the token-mixer seam, residual blocks and stacks,
the decode cache, recurrent stacks, losses, and generation. Its classes receive built parts;
``seqzoo.builder`` is the one place that builds them from recipe specs."""
