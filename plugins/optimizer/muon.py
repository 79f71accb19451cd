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

The learning rate: one ``train.lr`` for both parts, Muon's update rescaled by 0.2·√max(A, B) so
that its RMS matches AdamW's (``adjust_lr: match_rms_adamw``, Liu et al.'s rule). So lr, weight
decay and the schedule keep their AdamW meaning in both parts, a recipe tuned for AdamW is a fair
start, and a sweep tunes one rate. Keller Jordan's own rule (``adjust_lr: original``,
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
    scales it as it scales AdamW's. eps: ε of the AdamW part (1e-8). Refused under FSDP2: the
    iteration needs whole matrices, and FSDP2 gives each rank a slice."""

    shards = False

    def __init__(self, momentum: Probability = 0.95, nesterov: bool = True,
                 ns_steps: Annotated[int, Range(lo=1, hi=99)] = 5,
                 adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw",
                 matrix_lr: PositiveFloat | None = None, eps: PositiveFloat = 1e-8) -> None:
        if "Muon" not in vars(torch.optim):
            raise ConfigError(f"optimizer muon needs torch.optim.Muon (torch >= 2.9); this torch is "
                              f"{torch.__version__}: upgrade torch, or choose another optimizer")
        self.momentum, self.nesterov, self.ns_steps = momentum, nesterov, ns_steps
        self.adjust_lr, self.matrix_lr, self.eps = adjust_lr, matrix_lr, eps

    def build(self, params: TrainedParameters, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        if not params.hidden:
            raise ConfigError("optimizer muon: the model declares no hidden matrices (2-D weights inside the "
                              "layers its shard_units() returns), so Muon would train nothing; use adamw")
        muon = torch.optim.Muon([{"params": list(params.hidden), "weight_decay": weight_decay}],
                                lr=self.matrix_lr or lr, momentum=self.momentum, nesterov=self.nesterov,
                                ns_steps=self.ns_steps, adjust_lr_fn=self.adjust_lr)
        rest = adamw(params.groups(weight_decay, leave_out=params.hidden), lr=lr, betas=betas, eps=self.eps)
        return Joined([muon, rest])
