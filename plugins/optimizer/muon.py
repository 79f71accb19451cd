"""Muon (Jordan et al., 2024, "Muon: An optimizer for hidden layers in neural networks"; Liu et
al., 2025, "Muon is Scalable for LLM Training"): momentum, then the update orthogonalised, for the
model's hidden matrices; AdamW for every other tensor:

    B ← μ·B + (1 − μ)·g,   O = NS₅((1 − μ)·g + μ·B)   (Nesterov),   W ← W·(1 − lr·λ) − lr·0.2·√max(A, B)·O

NS₅ is five steps of a quintic Newton–Schulz iteration X ← a·X + (b·XXᵀ + c·(XXᵀ)²)·X from
X = G/‖G‖_F (in bfloat16, (a, b, c) = (3.4445, −4.775, 2.0315)), which pushes every singular
value of G towards 1: O ≈ UVᵀ for G = USVᵀ. ``torch.optim.Muon`` on the hidden matrices, fused
AdamW on the rest, stepped as one optimizer.

Which tensors are hidden matrices is what the model declares (``TrainedParameters.hidden``): the
2-D weights inside the model's layers (``Model.shard_units``). Embeddings, the LM head, norms,
biases, convolution kernels, stacked experts, and whatever a part lists in ``no_weight_decay``
(Mamba's A_log, the delta rule's dt bias, RWKV-7's token-shift mixes) train with AdamW.

A weight that stacks several matrices for one product (attention's [q | k | v], Mamba-2's [z | x |
B | C | Δ]; a part's ``stacked_rows``) is several matrices to Muon: each block of rows is
orthogonalised and scaled as the matrix it is, as it would be were the projections separate
tensors (transformers, torchtitan, modded-nanogpt); ``split_stacked: false`` orthogonalises the
stack whole, as ``torch.optim.Muon`` given the fused weight does. Each block is a view of the
weight, its gradient and its momentum, so the state and a checkpoint are as torch's Muon keeps them.

The learning rate: one ``train.lr`` for both parts, Muon's update rescaled by 0.2·√max(A, B) so
that its RMS matches AdamW's (``adjust_lr: match_rms_adamw``, Liu et al.'s rule). So lr, weight
decay and the schedule keep their AdamW meaning in both parts, and a recipe tuned for AdamW is a
fair start — not the optimum: in short runs at small batch Muon's best rate was several times
AdamW's (docs/training.md, "Muon's learning rate"). Keller Jordan's own rule (``adjust_lr: original``,
√max(1, A/B)) wants a rate about 0.02 on the matrices: set ``matrix_lr`` for it.
"""
from __future__ import annotations

from typing import Annotated, Literal

import torch

from seqzoo.errors import ConfigError
from seqzoo.interfaces import TrainedParameters, UpdateRule
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, Probability, Range

from ._adam import adamw
from ._joined import Joined


@builtin("orthogonalised momentum on hidden matrices (torch.optim.Muon), AdamW on the rest")
class Muon(UpdateRule):
    """momentum: μ (0.95). nesterov: Nesterov's momentum (true). ns_steps: Newton–Schulz steps (5).
    adjust_lr: how Muon's rate is scaled per matrix of shape (A, B): ``match_rms_adamw``,
    0.2·√max(A, B), so ``train.lr`` serves both parts; ``original``, √max(1, A/B) (Keller Jordan's,
    for a Muon rate near 0.02). matrix_lr: Muon's peak rate (null = ``train.lr``); the schedule
    scales it as it scales AdamW's. split_stacked: each matrix a stacked weight holds orthogonalised
    on its own (true), or the stack as one (false). eps: ε of the AdamW part (1e-8). Refused under
    FSDP2: the iteration needs whole matrices, and FSDP2 gives each rank a slice."""

    shards = False

    def __init__(self, momentum: Probability = 0.95, nesterov: bool = True,
                 ns_steps: Annotated[int, Range(lo=1, hi=99)] = 5,
                 adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw",
                 matrix_lr: PositiveFloat | None = None, split_stacked: bool = True,
                 eps: PositiveFloat = 1e-8) -> None:
        if "Muon" not in vars(torch.optim):
            raise ConfigError(f"optimizer muon needs torch.optim.Muon (torch >= 2.9); this torch is "
                              f"{torch.__version__}: upgrade torch, or choose another optimizer")
        self.momentum, self.nesterov, self.ns_steps = momentum, nesterov, ns_steps
        self.adjust_lr, self.matrix_lr, self.split_stacked, self.eps = adjust_lr, matrix_lr, split_stacked, eps

    def build(self, params: TrainedParameters, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        if not params.hidden:
            raise ConfigError("optimizer muon: the model declares no hidden matrices (2-D weights inside the "
                              "layers its shard_units() returns), so Muon would train nothing; use adamw")
        muon = StackedMuon([{"params": list(params.hidden), "weight_decay": weight_decay}],
                           params.stacked if self.split_stacked else {}, lr=self.matrix_lr or lr,
                           momentum=self.momentum, nesterov=self.nesterov, ns_steps=self.ns_steps,
                           adjust_lr_fn=self.adjust_lr)
        rest = adamw(params.groups(weight_decay, leave_out=params.hidden), lr=lr, betas=betas, eps=self.eps)
        return Joined([muon, rest])


class StackedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` that steps each block of rows of a stacked weight (``stacked``: row
    counts by parameter id) as a matrix of its own: torch's update runs on views of the weight,
    its gradient and its momentum buffer, one per block, so each is orthogonalised and its rate
    scaled by its own shape. Weights not in ``stacked`` step as in torch's Muon."""

    def __init__(self, params, stacked: dict[int, tuple[int, ...]], **options) -> None:
        super().__init__(params, **options)
        self.stacked = stacked

    def _init_group(self, group, params_with_grad, grads, muon_momentum_bufs, *args, **kwargs) -> bool:
        # torch's hook that gathers each step's tensors; later arguments (a newer torch's) pass through
        has_complex = super()._init_group(group, params_with_grad, grads, muon_momentum_bufs, *args, **kwargs)
        if self.stacked:
            whole = list(zip(params_with_grad, grads, muon_momentum_bufs))
            for target in (params_with_grad, grads, muon_momentum_bufs):
                target.clear()
            for param, grad, buffer in whole:
                rows = self.stacked.get(id(param), (param.shape[0],))
                params_with_grad.extend(param.split(rows))
                grads.extend(grad.split(rows))
                muon_momentum_bufs.extend(buffer.split(rows))
        return has_complex
