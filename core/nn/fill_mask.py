"""Fill-mask: the most likely tokens at each mask token of a text, from a masked-LM model
(``seqzoo.fill_mask``, ``seqzoo fill-mask``), as transformers' fill-mask pipeline gives them.

The mask token is the tokenizer's own ([MASK] for BERT, <mask> for RoBERTa), which it encodes as
one id. A tokenizer without one (``bytes``) still works when the model's vocabulary is larger than
the tokenizer's: the first id past the tokenizer's (259 for bytes) stands for the mask, written
[MASK] in text. Masked-LM training (``seqzoo train``) masks with the same token.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..errors import InputError
from ..interfaces import MaskedLanguageModel, Tokenizer
from ..registry import tokenizer as tokenizer_of

#: How a text writes the mask when the tokenizer has no mask token of its own.
MASK_TEXT = "[MASK]"


class MaskToken(NamedTuple):
    """The mask: its text, its id, and whether the tokenizer itself encodes the text as the id."""

    text: str
    id: int
    own: bool


class Prediction(NamedTuple):
    """One candidate for a mask: the token's id, its text and its probability."""

    id: int
    token: str
    probability: float


def _token_text(tok: Tokenizer, token_id: int) -> str:
    """What one id reads as: its decoded text, or its vocabulary entry for special tokens."""
    text = tok.decode([token_id])
    return text or tok.token(token_id) or f"[{token_id}]"  # special ids decode to nothing; their name


def mask_token(tok: Tokenizer, vocab_size: int) -> MaskToken:
    """The mask of ``tok`` for a model of ``vocab_size`` ids; an InputError when there is none."""
    if tok.mask_id is not None:
        return MaskToken(_token_text(tok, tok.mask_id), tok.mask_id, True)
    if tok.vocab_size < vocab_size:
        return MaskToken(MASK_TEXT, tok.vocab_size, False)
    raise InputError(f"the {type(tok).__name__} has no mask token ([MASK], <mask>), and the model's "
                     f"vocabulary (vocab_size={vocab_size}) has no id past the tokenizer's "
                     f"{tok.vocab_size} to stand for one; use a tokenizer with a mask token, or a "
                     f"model with vocab_size > {tok.vocab_size}")


def encode_masked(tok: Tokenizer, text: str, mask: MaskToken) -> list[int]:
    """``text`` as ids with each mask written as ``mask.text`` encoded as ``mask.id``."""
    if mask.own:
        return tok.encode(text)
    pieces = text.split(mask.text)
    ids = tok.encode(pieces[0])
    for piece in pieces[1:]:
        ids += [mask.id, *tok.encode(piece)]
    return ids


def check_masked_lm(model: nn.Module) -> None:
    """An InputError unless ``model`` predicts masked tokens (a MaskedLanguageModel with its head)."""
    if not isinstance(model, MaskedLanguageModel):
        raise InputError(f"{type(model).__name__} is not a masked-LM model (fill-mask needs a bidirectional "
                         f"encoder with model.mlm_head)")
    if not model.has_mlm_head:
        raise InputError(f"this {type(model).__name__} has no MLM head (model.mlm_head: null), so it cannot "
                         f"fill masks; import a *ForMaskedLM checkpoint or train one with mlm_head: {{}}")


@torch.no_grad()
def fill_mask(model: nn.Module, text: str, top_k: int = 5) -> list[list[Prediction]]:
    """The ``top_k`` most likely tokens, most likely first, at each mask token of ``text`` (in
    order), with their probabilities (softmax over the vocabulary in float32). The text is encoded
    with the model's tokenizer, which writes the mask as [MASK] (BERT), <mask> (RoBERTa), ..."""
    check_masked_lm(model)
    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    tok = tokenizer_of(model)
    vocab_size = model.recipe["model"]["vocab_size"]
    mask = mask_token(tok, vocab_size)
    ids = encode_masked(tok, text, mask)
    if mask.id not in ids:
        raise InputError(f"the text has no mask token: write {mask.text} where a token should be predicted "
                         f"(e.g. \"Paris is the {mask.text} of France.\")")
    device = next(model.parameters()).device
    batch = torch.tensor([ids], device=device)
    was_training = model.training
    model.eval()
    try:
        logits = model(batch, head=True, select=batch == mask.id)  # (N, V)
    finally:
        model.train(was_training)
    probs, best = logits.float().softmax(-1).topk(min(top_k, logits.shape[-1]), dim=-1)
    return [[Prediction(i, _token_text(tok, i), p) for i, p in zip(row_ids, row_probs)]
            for row_ids, row_probs in zip(best.tolist(), probs.tolist())]
