"""The GGUF forms of the gated-delta Qwens (not a family of their own): Qwen3-Next as llama.cpp's
``qwen3next``, Qwen3.5 as ``qwen35`` and ``qwen35moe``, each the tensors and metadata llama.cpp's own
converter writes from the same config.json (Kimi Linear's: ``_kimi_gguf``).

- Qwen3-Next: ``in_proj_qkvz``'s rows, grouped by key head, become ``attn_qkv`` ([q | k | v], every
  head of each) and ``attn_gate`` (z); ``in_proj_ba`` stays as it is (``ssm_ba``), as does the
  attention's double-wide q ([q_h | gate_h] per head: llama.cpp cuts each head's rows in two).
- Qwen3.5: its split projections keep their names, but the value heads go from grouped (key head j
  serves value heads j·R … j·R + R − 1) to tiled order (value head h reads key head h mod G, which
  ggml's broadcast gives for free): v's and z's rows, b's and a's, A_log, dt_bias, the conv's v
  channels and out_proj's columns.
- Both: A = −exp(A_log) (``ssm_a``), dt_bias as ``ssm_dt.bias``, the conv [C, 1, K] as [C, K], the
  (1 + w) norms stored as 1 + w — all but the gated norm of the delta layers, a plain w. Which layers
  recur is ``attention.recurrent_layers``; ``full_attention_interval`` is written too, as llama.cpp
  writes it (4 unless config.json names one). The rotary width is ``rope.dimension_count``.

What llama.cpp hard-codes and a model may not match is refused (``delta_problem``). One difference
is documented instead: llama.cpp L2-normalises the delta layers' q and k with ε = ``rms_norm_eps``
where transformers adds 1e-6 (the same ε for Qwen3-Next's and Qwen3.5's checkpoints).
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from torch import Tensor

from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import as_is, conv_squeezed, first, plus_one, shared_gate
from seqzoo.io.hf import Rule

from ._gated_delta import FULL, LINEAR
from ._qwen import every_layer_sparse

L2_EPS = 1e-6  # the ε transformers (and seqzoo) add in the L2 norm of the delta layers' q and k
PARTIAL = 0.25  # Qwen3-Next's partial_rotary_factor when config.json names none
INTERVAL = 4  # full_attention_interval's default, in transformers and llama.cpp
#: The gated-delta shape as llama.cpp's ssm.* keys hold it (the value width is derived).
DELTA_KEYS = (Key("ssm.conv_kernel", "linear_conv_kernel_dim"), Key("ssm.state_size", "linear_key_head_dim"),
              Key("ssm.group_count", "linear_num_key_heads"), Key("ssm.time_step_rank", "linear_num_value_heads"))
QWEN_MOE_KEYS = (Key("expert_count", "num_experts"), Key("expert_used_count", "num_experts_per_tok"),
                 Key("expert_feed_forward_length", "moe_intermediate_size"),
                 Key("expert_shared_feed_forward_length", "shared_expert_intermediate_size"))


def block(hf: str) -> str:
    return re.search(r"layers\.(\d+)\.", hf).group(1)


def shape(config: Mapping) -> tuple[int, int, int, int]:
    """(G, D_k, H, D_v) of a gated-delta config."""
    return (config["linear_num_key_heads"], config["linear_key_head_dim"], config["linear_num_value_heads"],
            config["linear_value_head_dim"])


# -- Qwen3-Next's fused projection ----------------------------------------------------------------
def qkvz(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """``in_proj_qkvz`` (rows per key head: q, k, the head's R values, its R gates) as ``attn_qkv``
    and ``attn_gate``, every head's q, then k, then v, and z alone."""
    heads, head_dim, value_heads, value_dim = shape(config)
    sizes = [head_dim, head_dim, value_heads // heads * value_dim, value_heads // heads * value_dim]
    b = block(hf)

    def save(w: Tensor) -> tuple[Tensor, Tensor]:
        q, k, v, z = (p.reshape(-1, w.shape[-1]) for p in w.reshape(heads, sum(sizes), -1).split(sizes, 1))
        return torch.cat([q, k, v]), z

    def load(qkv: Tensor, z: Tensor) -> Tensor:
        parts = (*qkv.split([heads * head_dim, heads * head_dim, value_heads * value_dim]), z)
        return torch.cat([p.reshape(heads, -1, p.shape[-1]) for p in parts], 1).reshape(-1, qkv.shape[-1])
    return Rule(hf, (f"blk.{b}.attn_qkv.weight", f"blk.{b}.attn_gate.weight"), load, save)


# -- Qwen3.5's value heads, grouped -> tiled ------------------------------------------------------
def tiled_order(config: Mapping, width: int, offset: int = 0) -> Tensor:
    """Indices that put ``width``-wide value heads, grouped by key head from ``offset`` on, in
    tiled order (the ``offset`` entries before them stay)."""
    heads, _, value_heads, _ = shape(config)
    heads_order = torch.arange(value_heads * width).view(heads, value_heads // heads, width).transpose(0, 1)
    return torch.cat([torch.arange(offset), offset + heads_order.reshape(-1)])


def log_rate(a: Tensor) -> Tensor:
    """A_log from llama.cpp's A = −exp(A_log), chosen so that exp(A_log) gives −A back exactly: an
    A_log below 1 has float32 neighbours with the same exp, which the file cannot tell apart (the
    mixers read A_log only through its exp, so they compute the same)."""
    rate = -a
    out = torch.log(rate)
    for way in (torch.inf, -torch.inf):  # log's rounding may miss by one step
        near = torch.nextafter(out, torch.full_like(out, way))
        out = torch.where((torch.exp(out) != rate) & (torch.exp(near) == rate), near, out)
    return out


def a_from_log(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """A_log as llama.cpp's A = −exp(A_log) (``ssm_a``)."""
    return Rule(hf, (gguf_name,), log_rate, lambda a: (-torch.exp(a),))


SAME = (lambda t: t, lambda t: t)
NEG_EXP = (lambda a: -torch.exp(a), log_rate)  # A_log -> llama.cpp's A, and back
SQUEEZED = (lambda t: t.squeeze(1), lambda t: t.unsqueeze(1))  # a depthwise conv [C, 1, K] -> [C, K], and back


def tiled(dim: int, *, scalar: bool = False, after_keys: bool = False, then: tuple = SAME):
    """Value heads reordered along ``dim``, each D_v entries wide (one if ``scalar``), after the q
    and k entries if ``after_keys``; ``then`` (to GGUF, from GGUF) changes the values too."""
    def rule(hf: str, gguf_name: str, config: Mapping) -> Rule:
        heads, head_dim, _, value_dim = shape(config)
        order = tiled_order(config, 1 if scalar else value_dim, 2 * heads * head_dim if after_keys else 0)
        inverse, (out, back) = torch.argsort(order), then
        return Rule(hf, (gguf_name,), lambda t: back(t).index_select(dim, inverse),
                    lambda t: (out(t.index_select(dim, order)),))
    return rule


#: Norms: Qwen's (1 + w), but the delta layers' gated norm is a plain w.
QWEN_NORMS = (Transform(r"linear_attn\.norm\.weight$", as_is), Transform(r"norm\.weight$", plus_one),
              Transform(r"shared_expert_gate\.weight$", shared_gate))
QWEN3NEXT_TRANSFORMS = (Transform(r"in_proj_qkvz\.weight$", qkvz), Transform(r"\.A_log$", a_from_log),
                        Transform(r"conv1d\.weight$", conv_squeezed), *QWEN_NORMS)
QWEN35_TRANSFORMS = (Transform(r"in_proj_qkv\.weight$", tiled(0, after_keys=True)),
                     Transform(r"in_proj_z\.weight$", tiled(0)),
                     Transform(r"in_proj_[ab]\.weight$|\.dt_bias$", tiled(0, scalar=True)),
                     Transform(r"\.A_log$", tiled(0, scalar=True, then=NEG_EXP)),
                     Transform(r"linear_attn\.conv1d\.weight$", tiled(0, after_keys=True, then=SQUEEZED)),
                     Transform(r"linear_attn\.out_proj\.weight$", tiled(1)), *QWEN_NORMS)


# -- metadata -------------------------------------------------------------------------------------
def delta_metadata(config: Mapping) -> dict:
    """The keys llama.cpp's converter derives: the value width, the recurrent layers, the rotary width."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    factor = (config.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                         config.get("partial_rotary_factor", PARTIAL))
    return {"ssm.inner_size": config["linear_value_head_dim"] * config["linear_num_value_heads"],
            "attention.recurrent_layers": [kind == LINEAR for kind in config["layer_types"]],
            "full_attention_interval": config.get("full_attention_interval", INTERVAL),
            "rope.dimension_count": int(head_dim * factor)}


def sections(pairs: int) -> list[int]:
    """M-RoPE sections over ``pairs`` rotary pairs as Qwen3.5 splits its 32 ([11, 11, 10]): a text
    token has one position in every section, so any split is plain RoPE, but llama.cpp needs one
    that fits the rotary width."""
    t = -(-pairs // 3)
    h = -(-(pairs - t) // 2)
    return [t, h, pairs - t - h]


def qwen35_metadata(config: Mapping) -> dict:
    out = delta_metadata(config)
    split = list(config.get("mrope_section") or sections(out["rope.dimension_count"] // 2))
    return {**out, "rope.dimension_sections": split + [0] * (4 - len(split))}


def delta_config(get) -> dict:
    """config.json's keys from the file's derived ones (the inverse of ``delta_metadata``)."""
    n, interval = get("block_count"), get("full_attention_interval", INTERVAL)
    recurrent = get("attention.recurrent_layers")
    if recurrent is None:  # as llama.cpp marks them without the list
        recurrent = [(i + 1) % interval != 0 for i in range(n)]
    head_dim = get("attention.key_length") or get("embedding_length") // get("attention.head_count")
    out = {"layer_types": [LINEAR if r else FULL for r in recurrent], "full_attention_interval": interval,
           "linear_value_head_dim": get("ssm.inner_size") // get("ssm.time_step_rank"),
           "partial_rotary_factor": get("rope.dimension_count", head_dim) / head_dim, "hidden_act": "silu",
           "attention_bias": False}
    if get("expert_count"):
        out.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    return out


def qwen35_config(get) -> dict:
    split = get("rope.dimension_sections")
    return {**delta_config(get), **({"mrope_section": list(split)[:3]} if split is not None else {})}


def eps_note(norms: str) -> Callable[[Mapping], None]:
    """A warning (no refusal) where llama.cpp's ε for ``norms`` — the model's ``rms_norm_eps`` —
    is not transformers' and seqzoo's 1e-6: their logits then differ slightly (docs/gguf.md)."""
    def note(config: Mapping) -> None:
        if config["rms_norm_eps"] != L2_EPS:
            warnings.warn(f"export-gguf: llama.cpp computes {norms} with ε = rms_norm_eps ({config['rms_norm_eps']}) "
                          f"where this model, as transformers, uses {L2_EPS}: llama.cpp's logits will differ slightly "
                          f"from seqzoo's", stacklevel=2)
    return note


def delta_problem(config: Mapping) -> str | None:
    """What llama.cpp's qwen3next and qwen35 graphs hard-code."""
    if config["linear_key_head_dim"] != config["linear_value_head_dim"]:
        return (f"llama.cpp sizes the gated-delta value heads by linear_key_head_dim (its ssm.state_size); this "
                f"model's key and value heads are {config['linear_key_head_dim']} and "
                f"{config['linear_value_head_dim']} wide")
    if config.get("attention_bias"):
        return "llama.cpp's Qwen3-Next and Qwen3.5 attention has no biases; this model has them (attention_bias)"
    if (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        return "seqzoo writes Qwen3-Next's and Qwen3.5's GGUF with unscaled RoPE only; this model scales it"
    return eps_note("the L2 norm of the gated-delta layers' q and k")(config)


QWEN3NEXT = GGUFArch("qwen3next", keys=LLAMA_KEYS + QWEN_MOE_KEYS + DELTA_KEYS, transforms=QWEN3NEXT_TRANSFORMS,
                     renames={r"\.dt_bias$": ".dt_proj.bias"}, export=delta_metadata, config=delta_config,
                     problem=first(delta_problem, every_layer_sparse(normalized=True)))
QWEN35 = GGUFArch("qwen35", keys=LLAMA_KEYS + DELTA_KEYS, transforms=QWEN35_TRANSFORMS,
                  renames={r"\.dt_bias$": ".dt_proj.bias"}, export=qwen35_metadata, config=qwen35_config,
                  problem=delta_problem)
#: Qwen3.5-MoE's config.json has no dense width (llama.cpp's converter then writes none).
NO_DENSE = tuple(replace(k, optional=True) if k.name == "feed_forward_length" else k for k in LLAMA_KEYS)
QWEN35MOE = GGUFArch("qwen35moe", keys=NO_DENSE + QWEN_MOE_KEYS + DELTA_KEYS, transforms=QWEN35_TRANSFORMS,
                     renames={r"\.dt_bias$": ".dt_proj.bias"}, export=qwen35_metadata, config=qwen35_config,
                     problem=delta_problem)  # its converter has experts in every layer, renormalised

