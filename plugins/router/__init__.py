"""Routers of a mixture of experts: which experts each token goes to, and with what weights."""
