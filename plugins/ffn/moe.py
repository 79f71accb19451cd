"""A sparse mixture of experts in place of the dense FFN (Shazeer et al., 2017; GShard, Lepikhin et
al., 2021; Switch, Fedus et al., 2022; Mixtral, Jiang et al., 2024):

    y = s · Σ_{j ≤ k} w_j(x) · E_{e_j(x)}(x)  [+ σ(g·x) · S(x)]

A router (a ``router`` component) picks k of E experts per token with weights w; each expert E_e is
any registered dense ``ffn``; s is ``routed_scale`` (DeepSeek-V3's 2.5); S is an optional shared
expert every token goes through (DeepSeek, Qwen2-MoE), gated by a sigmoid in Qwen2-MoE.

Tokens are grouped by expert, not looped over: the N·k (token, slot) pairs are sorted by expert,
the tokens gathered once, each expert run on its contiguous slice (one Python iteration per
expert that received tokens), and the weighted outputs scattered back with one ``index_add``.
Decoding (no autograd, at most ``max(E, GATHER_PAIRS)`` pairs, stacked experts, no capacity)
gathers the chosen experts' weights by index instead and runs one batched product: the same
weights read, but shapes fixed by N and k, so a compiled decode step is one graph.
Gated experts (glu, swiglu, geglu) are stored stacked (``_experts``: ``experts.gate_up`` (E, 2F,
C), ``experts.down`` (E, C, F)); any other ffn kind is a list of modules (``experts.e.*``).
An expert that receives no token is skipped (no empty matmul, nothing NaN), and none is dropped
unless ``capacity_factor`` sets a capacity of ⌈factor · N·k / E⌉ tokens per expert (the first
tokens in sequence order keep their place, as in GShard).

While training, the layer records its signals (``seqzoo.interfaces.AuxiliaryLosses``):
- ``balance_loss``, the Switch load-balancing loss E · Σ_e f_e · P_e, with f_e the fraction of
  the N·k assignments that went to e and P_e the mean router probability of e — 1 at a perfect
  balance, E when every token goes to one expert; it joins the objective times ``balance_loss``;
- ``z_loss``, the router z-loss mean((logsumexp r)²) (Zoph et al., 2022), times ``z_loss``;
- ``expert_load``, f_e itself, reported only.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.interfaces import AuxiliaryLosses, FeedForward, Routing
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeFloat, PositiveFloat, PositiveInt, Spec

from ._experts import StackedExperts
from ._glu import GLU

#: The most (token, slot) pairs the gathered path takes when there are fewer experts: a gathered
#: weight is read once per pair, so past E pairs it reads some expert twice, which the grouped
#: path never does; 16 covers batch 8 at top-2 (measured in docs/performance.md).
GATHER_PAIRS = 16


@builtin("mixture of experts: a router, k of E dense experts, optional shared expert")
class MixtureOfExperts(FeedForward, AuxiliaryLosses):
    """experts: E (required). top_k: k experts per token (2). expert: each expert's dense ffn, by
    name or ``{kind: NAME, **params}`` (swiglu). router: the ``router`` component (softmax_topk).
    shared: a dense ffn every token also goes through (null). shared_gate: scale the shared output
    by σ(w·x) (false; Qwen2-MoE). routed_scale: s (1.0). capacity_factor: per-expert capacity
    (null: no token dropped). balance_loss: the balancing loss's coefficient in the objective
    (0.01). z_loss: the z-loss's coefficient (0)."""

    recipe_example = """
        seqzoo: 1
        extends: tiny-llama
        model:
          ffn:                          # 8 SwiGLU experts, 2 per token, a shared one, Mixtral's router
            kind: moe
            experts: 8
            top_k: 2
            expert: {kind: swiglu, hidden: 64}
            router: {kind: softmax_topk, normalize: true}
            shared: {kind: swiglu, hidden: 64}
            balance_loss: 0.01
            z_loss: 0.001
          layer_types: {dense: {ffn: {kind: swiglu, hidden: 128}}, moe: {}}
          pattern: [dense, moe]        # every other layer sparse
        """
    example_params = {"experts": 4, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 16}}

    def __init__(self, dim: int, experts: PositiveInt, top_k: PositiveInt = 2,
                 expert: Spec["ffn"] = "swiglu", router: Spec["router"] = "softmax_topk",  # noqa: F821
                 shared: Spec["ffn"] | None = None, shared_gate: bool = False,  # noqa: F821
                 routed_scale: PositiveFloat = 1.0, capacity_factor: PositiveFloat | None = None,
                 balance_loss: NonNegativeFloat = 0.01, z_loss: NonNegativeFloat = 0.0) -> None:
        super().__init__(dim)
        if shared_gate and shared is None:
            raise ConfigError("moe: shared_gate needs a shared expert (set shared)")
        # router, expert and shared arrive as factories (the recipe's specs, built by the registry)
        self.router = router(dim, experts, top_k)
        first = expert(dim)
        if isinstance(first, MixtureOfExperts):
            raise ConfigError("moe: an expert must be a dense ffn, not another moe")
        # gated experts are stacked (one product per expert for gate and up, no module per expert);
        # any other dense ffn stays a list of modules
        stack = isinstance(first, GLU) and first.dropout.p == 0
        if stack and first.gate.weight.is_meta:  # nothing to initialise: the first stands for all
            self.experts = StackedExperts([first], count=experts)
        else:
            built = [first, *(expert(dim) for _ in range(experts - 1))]
            self.experts = StackedExperts(built) if stack else nn.ModuleList(built)
        self.count = experts
        self.shared = shared(dim) if shared is not None else None
        self.shared_gate = Linear(dim, 1, bias=False) if shared_gate else None
        self.top_k, self.routed_scale, self.capacity_factor = top_k, routed_scale, capacity_factor
        self.coefficients = {"balance_loss": balance_loss, "z_loss": z_loss}
        self.auxiliary, self.statistics = {}, {}

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C); while training, also the layer's auxiliary losses."""
        tokens = x.reshape(-1, x.shape[-1])  # (N, C)
        routing = self.router(tokens)
        y = self.gathered(tokens, routing) if self.decoding(tokens) else self.dispatch(tokens, routing)
        if self.routed_scale != 1.0:
            y = y * self.routed_scale
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_gate is not None:
                shared = shared * torch.sigmoid(self.shared_gate(tokens))
            y = y + shared
        self.auxiliary, self.statistics = self.signals(routing) if self.training else ({}, {})
        return y.reshape(x.shape)

    def decoding(self, tokens: Tensor) -> bool:
        """Whether this call takes the gathered path: a few tokens (decoding) and nothing that
        needs the grouped one (a gradient, a capacity, unstacked experts)."""
        return (isinstance(self.experts, StackedExperts) and self.capacity_factor is None
                and tokens.shape[0] * self.top_k <= max(self.count, GATHER_PAIRS)
                and not (torch.is_grad_enabled() and (tokens.requires_grad or self.experts.gate_up.requires_grad)))

    def gathered(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Σ_j w_j · E_{e_j}(x) (N, C) from each token's gathered expert weights: fixed shapes."""
        return self.experts.gathered(tokens, routing.experts, routing.weights)

    def dispatch(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Σ_j w_j · E_{e_j}(x) for each of the N tokens (N, C): sorted by expert, one gather, one
        product per expert that has tokens, one scatter-add."""
        n, k = routing.experts.shape
        chosen = routing.experts.flatten()  # (N·k,) expert of each (token, slot)
        order = chosen.argsort(stable=True)  # stable: within an expert, tokens keep sequence order
        counts = torch.bincount(chosen, minlength=self.count)  # (E,)
        token = order // k
        weight = routing.weights.flatten()[order].to(tokens.dtype)
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * n * k / self.count)
            start = torch.cumsum(counts, 0) - counts  # (E,) first sorted slot of each expert
            rank = torch.arange(n * k, device=tokens.device) - start.repeat_interleave(counts)
            kept = rank < capacity
            token, weight = token[kept], weight[kept]
            counts = counts.clamp(max=capacity)
        parts = tokens[token].split(counts.tolist())  # one gather, then a (N_e, C) slice per expert
        if isinstance(self.experts, StackedExperts):
            outputs = self.experts(parts)
        else:
            pieces = [self.experts[e](part) for e, part in enumerate(parts) if len(part)]
            outputs = torch.cat(pieces) if pieces else tokens.new_zeros(0, tokens.shape[-1])
        return tokens.new_zeros(tokens.shape).index_add_(0, token, outputs * weight[:, None])

    def signals(self, routing: Routing) -> tuple[dict[str, tuple[float, Tensor]], dict[str, Tensor]]:
        """The Switch balancing loss and the z-loss (with their coefficients), and the load f."""
        experts = self.count
        load = torch.bincount(routing.experts.flatten(), minlength=experts).float() / routing.experts.numel()
        balance = experts * (load * routing.probs.mean(0)).sum()
        z = torch.logsumexp(routing.logits, dim=-1).square().mean()
        return ({"balance_loss": (self.coefficients["balance_loss"], balance),
                 "z_loss": (self.coefficients["z_loss"], z)}, {"expert_load": load})

    def active_parameters(self) -> int:
        """The router, the shared expert and ``top_k`` of the ``experts`` routed ones."""
        total = sum(p.numel() for p in self.parameters())
        routed = sum(p.numel() for p in self.experts.parameters())
        return total - routed + routed * self.top_k // self.count

    def extra_repr(self) -> str:
        return (f"experts={self.count}, top_k={self.top_k}, routed_scale={self.routed_scale}, "
                f"capacity_factor={self.capacity_factor}")
