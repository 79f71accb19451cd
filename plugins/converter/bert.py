"""BERT (Devlin et al., 2019) <-> ``encoder``: word + position + token-type embeddings, their
LayerNorm (``embed_norm``), post-norm blocks, the pooler tanh(W h_[CLS] + b), and the masked-LM
head LN(act(W h + b)) Eᵀ + b_V (``mlm_head``).

``BertModel`` checkpoints are read as they are. Task models store the encoder under ``bert.``:
``BertForMaskedLM`` brings its head (``cls.predictions``; the decoder is the word embedding, its
bias ``cls.predictions.bias``); ``BertForPreTraining`` also brings the next-sentence head
(``cls.seq_relationship``), which the import drops with a one-line warning. Other task heads are
reported as unexpected tensors. A model with ``mlm_head`` exports as ``BertForMaskedLM``, one
without as ``BertModel``. RoBERTa and XLM-R share its layout (``_bert.py``).
"""
from __future__ import annotations

from seqzoo.io.gguf import GGUFArch, Key
from seqzoo.registry import builtin

from ._bert import BertLayout


@builtin("Hugging Face BERT <-> encoder (token types, pooler, MLM head, post-norm)")
class BertConverter(BertLayout):
    """config.json keys: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
    hidden_act, max_position_embeddings, type_vocab_size, layer_norm_eps, *_dropout_prob,
    tie_word_embeddings (true with a masked-LM head). The pooler and the masked-LM head are
    imported when the checkpoint has them."""

    # llama.cpp's bert computes embeddings: no pooler or masked-LM head (left out, with a warning).
    gguf = GGUFArch("bert", rope=False, output="never", drop=(r"^pooler\.", r"^cls\.", r"^lm_head\."),
                    keys=(Key("block_count", "num_hidden_layers"), Key("context_length", "max_position_embeddings"),
                          Key("embedding_length", "hidden_size"), Key("feed_forward_length", "intermediate_size"),
                          Key("attention.head_count", "num_attention_heads"),
                          Key("attention.layer_norm_epsilon", "layer_norm_eps", "f32")),
                    fixed={"attention.causal": False},
                    problem=lambda c: None if c.get("hidden_act", "gelu") in ("gelu", "gelu_new", "gelu_pytorch_tanh")
                    else f"llama.cpp's bert uses a GELU; this model's activation is {c['hidden_act']}",
                    config=lambda get: {"hidden_act": "gelu", "position_embedding_type": "absolute"})
