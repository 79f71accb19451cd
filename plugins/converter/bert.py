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

from seqzoo.registry import builtin

from ._bert import BertLayout


@builtin("Hugging Face BERT <-> encoder (token types, pooler, MLM head, post-norm)")
class BertConverter(BertLayout):
    """config.json keys: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
    hidden_act, max_position_embeddings, type_vocab_size, layer_norm_eps, *_dropout_prob,
    tie_word_embeddings (true with a masked-LM head). The pooler and the masked-LM head are
    imported when the checkpoint has them."""
