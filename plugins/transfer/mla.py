"""MHA / GQA → multi-head latent attention (in the manner of MHA2MLA, Ji et al., 2025, and
TransMLA, Meng et al., 2025): ``model.mixer`` attention → ``{kind: mla, latent_norm: false, ...}``
with the same heads, qk_nope_head_dim + qk_rope_head_dim = the old head dim D and v_head_dim = D.

Three steps, each chosen so that it is exact where it can be and measured where it cannot:

1. **Partial RoPE.** MLA rotates only d_r of each head's D query/key dims. The rule keeps the d_r/2
   *highest* rotary frequencies (ω_i = base^(−2i/R), i < d_r/2, R the old rotated width) rotating
   and lets the other dims become the unrotated "nope" part. The new model's RoPE runs over d_r
   dims, ω'_j = base'^(−2j/d_r), so ``model.position.base`` must become base^(d_r/R): then
   ω'_j = ω_j and the kept pairs turn exactly as they did (linear, YaRN and LLaMA-3 scaling depend
   on the frequencies alone and carry over too). The dims that stop rotating change the function;
   that is MHA2MLA's partial-RoPE step, which the logit difference measures.
2. **One shared rotary key.** MLA's k_pe is shared by all heads: with K > 1 K/V heads the rule
   takes the mean of their rotated rows (exact for MQA, K = 1), and reports its relative error.
3. **The latent.** The K heads' unrotated key rows and value rows, stacked (K·(d_n + D), C), are
   factorised by SVD, W = U S Vᵀ: W_DKV = V_rᵀ (the latent c = V_rᵀ x, r = kv_lora_rank) and the
   up-projection U_r S_r, each query head reading the rows of its K/V group. Keeping the r largest
   singular values is the best rank-r approximation in the Frobenius norm (Eckart–Young); the
   relative error √(Σ_{i>r} σ_i²) / √(Σ σ_i²) is reported. The new mixer must be built without
   the latent RMSNorm (``latent_norm: false``): a per-token normalisation of c has no counterpart
   in the trained attention.

The q rows are permuted per head ([nope | rope]), the output projection is copied, and the cache
per token and layer shrinks from 2·K·D numbers to r + d_r. Exact when K = 1 and r reaches W's
rank, apart from the dims that stop rotating; a short fine-tune heals the rest.
"""
from __future__ import annotations

import json

import torch

from seqzoo.errors import InputError
from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin

from ._layers import block, kind_of

#: Scalings whose frequencies are a function of the unscaled ω_i alone (so base^(d_r/R) keeps them).
FREQUENCY_ONLY = (None, "linear", "yarn", "llama3")


def rotary_rows(rotated: int, kept: int, interleaved: bool, new_interleaved: bool) -> list[int]:
    """The old head's dims that become the new d_r = ``kept`` rotated dims, in the new layout's
    order: frequency i of the old R = ``rotated`` dims sits at (2i, 2i+1) interleaved or
    (i, i + R/2) rotate-half, and goes to (2j, 2j+1) or (j, j + d_r/2) of the new ones."""
    pairs = [(2 * i, 2 * i + 1) if interleaved else (i, i + rotated // 2) for i in range(kept // 2)]
    order = [0] * kept
    for j, (a, b) in enumerate(pairs):
        first, second = (2 * j, 2 * j + 1) if new_interleaved else (j, j + kept // 2)
        order[first], order[second] = a, b
    return order


@builtin("MHA/GQA -> latent attention: partial RoPE, a shared rotary key, SVD of the K/V projections")
class MLATransfer(TransferRule):
    """Claims ``model.mixer`` from attention to ``mla``, and the ``model.position`` base and
    rotary_dim it needs."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        keys = [k for k in changed if k == "mixer" or k.startswith("mixer.")]
        if not keys or kind_of(new["mixer"]) not in ("mla", "latent_attention") \
                or kind_of(old["mixer"]) not in (None, "attention", "mha"):
            return []
        self._check(old, new)
        return keys + [k for k in changed if k in ("position.base", "position.rotary_dim")]

    def _check(self, old: dict, new: dict) -> None:
        """One line for the first thing the rule cannot carry, naming the key and the fix."""
        attn, mla, pos, new_pos = old["attention"], new["mixer"], old["position"], new["position"]
        heads, d = attn["heads"], attn["head_dim"] or old["dim"] // attn["heads"]
        need = lambda ok, key, fix: ok or _refuse(key, fix)  # noqa: E731
        need(old["kind"] == "decoder_lm" and not old.get("pattern"), "model.pattern",
             "the mla rule converts a uniform decoder (edit one without a per-layer pattern)")
        for key, value in (("qk_norm", None), ("softcap", None), ("sinks", False), ("window", None),
                           ("bias", False), ("out_bias", False)):
            need(attn.get(key) in (value, None), f"model.attention.{key}",
                 f"the mla rule needs {key}: {json.dumps(value)}")
        score = attn["score"]
        need(kind_of(score) == "scaled_dot" and (not isinstance(score, dict) or score.get("scale") is None),
             "model.attention.score", "the mla rule needs the default scaled_dot score")
        need(mla["heads"] == heads, "model.mixer.heads", f"keep heads: {heads}")
        need(mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] == d, "model.mixer.qk_nope_head_dim",
             f"qk_nope_head_dim + qk_rope_head_dim must be the head dim {d}")
        need((mla.get("v_head_dim") or mla["qk_nope_head_dim"]) == d, "model.mixer.v_head_dim",
             f"set v_head_dim: {d}")
        need(mla.get("q_lora_rank") is None, "model.mixer.q_lora_rank", "set q_lora_rank: null")
        need(mla.get("latent_norm") is False, "model.mixer.latent_norm",
             "set latent_norm: false (a trained attention has no norm on its keys and values)")
        need(not mla.get("bias") and mla.get("scale") is None, "model.mixer.bias",
             "set bias: false and scale: null")
        need(kind_of(pos) == kind_of(new_pos) and kind_of(pos) in ("rope", "none"), "model.position",
             "keep the position scheme (rope or none)")
        if kind_of(pos) == "rope":
            rotated, kept = pos["rotary_dim"] or d, mla["qk_rope_head_dim"]
            need(kept % 2 == 0 and kept <= rotated, "model.mixer.qk_rope_head_dim",
                 f"an even number up to the rotated dims {rotated}")
            need(new_pos.get("rotary_dim") is None, "model.position.rotary_dim", "set rotary_dim: null")
            need(new_pos["scaling"] == pos["scaling"] and kind_of(pos["scaling"]) in FREQUENCY_ONLY,
                 "model.position.scaling", f"keep it, one of {', '.join(map(str, FREQUENCY_ONLY))}")
            base = pos["base"] ** (kept / rotated)
            need(abs(new_pos["base"] / base - 1) < 1e-6, "model.position.base",
                 f"set it to {base!r} = {pos['base']:g}^({kept}/{rotated}), so that the kept "
                 f"frequencies stay those the model was trained with")

    def transfer(self, old, new, old_state, new_state):
        attn, mla, pos, new_pos = old["attention"], new["mixer"], old["position"], new["position"]
        h, d = attn["heads"], attn["head_dim"] or old["dim"] // attn["heads"]
        k_heads, nope, rank = attn["kv_heads"] or h, mla["qk_nope_head_dim"], mla["kv_lora_rank"]
        rotated = pos.get("rotary_dim") or d
        rope_rows = rotary_rows(rotated, mla["qk_rope_head_dim"],
                                pos.get("interleaved", False), new_pos.get("interleaved", False)) \
            if kind_of(pos) == "rope" else list(range(d - mla["qk_rope_head_dim"], d))
        nope_rows = [i for i in range(d) if i not in rope_rows]
        # exact: one K/V head, a rank that holds W, and every rotated dim still rotating
        self.exact = k_heads == 1 and rank >= min(nope + d, old["dim"]) and (
            kind_of(pos) == "none" or mla["qk_rope_head_dim"] == rotated)
        self.kv, self.rope_key = [0.0, 0.0], [0.0, 0.0]  # (Σ dropped σ², Σ σ²), (pooling error², ‖k_pe‖²)
        made = {}
        for i in range(old["layers"]):
            p = f"{block(i)}mixer."
            names = {part: f"{p}{part}.weight" for part in ("q_proj", "kv_a_proj", "kv_b_proj")}
            made.update({n: f"from {p}qkv_proj.weight: {how}" for n, how in zip(names.values(), (
                "rows per head ordered [nope | rope]",
                f"[SVD down-projection V_rᵀ (r={rank}) | the shared rotary key"
                + (f", the mean of {k_heads} heads' rows]" if k_heads > 1 else "]"),
                "U_r S_r, each query head its K/V group's rows"))})
            weight = old_state[f"{p}qkv_proj.weight"]
            if weight.is_meta:  # a dry run: the plan only
                continue
            q, k, v = (t.view(-1, d, weight.shape[1]).double() for t in weight.split([h * d, k_heads * d,
                                                                                       k_heads * d]))
            with torch.no_grad():
                new_state[names["q_proj"]].copy_(torch.cat([q[:, nope_rows], q[:, rope_rows]], 1).flatten(0, 1))
                k_rope = k[:, rope_rows]  # (K, d_r, C)
                shared = k_rope.mean(0)
                self.rope_key[0] += float((k_rope - shared).pow(2).sum())
                self.rope_key[1] += float(k_rope.pow(2).sum())
                stacked = torch.cat([k[:, nope_rows], v], 1)  # (K, d_n + D, C)
                u, s, vh = torch.linalg.svd(stacked.flatten(0, 1), full_matrices=False)
                self.kv[0] += float(s[rank:].pow(2).sum())
                self.kv[1] += float(s.pow(2).sum())
                keep = min(rank, s.numel())  # a rank above W's: the extra latent dims stay zero
                down = weight.new_zeros(rank, weight.shape[1], dtype=torch.float64)
                up = weight.new_zeros(stacked.shape[0] * stacked.shape[1], rank, dtype=torch.float64)
                down[:keep], up[:, :keep] = vh[:keep], u[:, :keep] * s[:keep]
                new_state[names["kv_a_proj"]].copy_(torch.cat([down, shared]))
                per_query = up.view(k_heads, nope + d, rank).repeat_interleave(h // k_heads, 0)
                new_state[names["kv_b_proj"]].copy_(per_query.flatten(0, 1))
        return made

    def error(self, old_state, new_state):
        out = {"relative K/V weight error (SVD)": (self.kv[0] / self.kv[1]) ** 0.5 if self.kv[1] else 0.0}
        if self.rope_key[1] and self.rope_key[0]:
            out["relative rotary key error (heads pooled)"] = (self.rope_key[0] / self.rope_key[1]) ** 0.5
        return out


def _refuse(key: str, fix: str) -> bool:
    raise InputError(f"edit: {key}: {fix}")
