"""The bidirectional encoder (BERT family)."""
from __future__ import annotations

import pytest
import torch

import seqzoo


@pytest.fixture
def bert():
    return seqzoo.build("tiny-bert", device="cpu").eval()


def test_hidden_states_shape_and_pooler(bert):
    ids = torch.randint(0, 259, (2, 9))
    with torch.no_grad():
        hidden = bert(ids)
        pooled = bert.pool(hidden)
    assert hidden.shape == (2, 9, 64) and pooled.shape == (2, 64)
    torch.testing.assert_close(pooled, torch.tanh(bert.pooler(hidden[:, 0])))


def test_every_token_sees_later_tokens(bert):
    ids = torch.randint(0, 259, (1, 8))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 259
    with torch.no_grad():
        assert not torch.allclose(bert(ids)[0, 0], bert(changed)[0, 0])


def test_right_padding_leaves_real_tokens_unchanged(bert):
    ids = torch.randint(0, 256, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(bert(padded, attention_mask=mask)[:, :6], bert(ids), atol=1e-5, rtol=1e-5)


def test_token_types_change_the_output(bert):
    ids = torch.randint(0, 259, (1, 6))
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        assert not torch.allclose(bert(ids, token_type_ids=types), bert(ids))


def test_post_norm_block_matches_bert_layer_formula(bert):
    """h = LN(x + Attn(x)); out = LN(h + FFN(h)) — written out with the block's own modules."""
    from seqzoo.nn.attention import self_attention_inputs

    block = bert.encoder.blocks[0]
    x = torch.randn(2, 5, 64)
    inputs = self_attention_inputs(bert.encoder.position, torch.arange(5)[None], causal=False)
    with torch.no_grad():
        h = block.mixer_norm(x + block.mixer(x, inputs))
        expected = block.ffn_norm(h + block.ffn(h))
        torch.testing.assert_close(block(x, inputs), expected)


def test_pool_without_pooler_is_a_clear_error():
    model = seqzoo.build("tiny-bert", ["model.pooler=false"], device="cpu")
    with pytest.raises(seqzoo.InputError, match="built with pooler: false"):
        model.pool(torch.zeros(1, 2, 64))
