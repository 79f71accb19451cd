"""Tokenizers in GGUF metadata: byte-level BPE (``tokenizer.ggml.model`` gpt2) both ways, with the
pre-tokenizer name llama.cpp splits text by (``tokenizer.ggml.pre``), and BERT's WordPiece
(``bert``), whose tokens llama.cpp spells with a phantom space: a word-initial piece ``x`` is
``▁x`` and a continuation ``##x`` is ``x``.

SentencePiece's Unigram in T5's layout (a precompiled normaliser, whitespace split, ``▁`` before
each word) is llama.cpp's ``t5`` vocabulary: the pieces with their log-probability scores, the
same precompiled character map (llama.cpp applies it as SentencePiece does), extra whitespace
removed.

seqzoo's ``bytes`` tokenizer is written as a byte-level BPE with no merges: one token per byte, in
byte order, then its special tokens, so llama.cpp tokenizes text exactly as seqzoo does (with no
merges, how the text is split first changes nothing). A tokenizer whose pre-tokenizer has no
llama.cpp name is refused before anything is written.
"""
from __future__ import annotations

import base64
import json

from torch import nn

from ...errors import CheckpointError, few
from ...registry import tokenizer

#: ``tokenizer.ggml.pre`` values whose splits this reader rebuilds: GPT-2's regex, or every digit
#: split first (SmolLM, StarCoder).
GPT2_PRE = ("gpt-2", "gpt2", "default", "mpt", "olmo", "jais", "phi-2", "modern-bert")
DIGITS_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
#: llama.cpp refuses a BPE vocabulary without merges and GGUF cannot hold an empty list, so the
#: bytes tokenizer is written with this one merge, which never applies: GPT-2's split puts a letter
#: and a digit in different pieces. Its result is no token, and the import drops such merges.
NEVER_MERGED = "a 1"
#: GGUF token types (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5
#: The score of a padding row of a Unigram vocabulary: llama.cpp's Viterbi can match an unused
#: token's text, so it is made never worth it (llama.cpp's own converter writes this value).
PADDING_SCORE = -10000.0


def document(model: nn.Module) -> dict:
    """The model's tokenizer as a tokenizers tokenizer.json document."""
    tok = tokenizer(model)
    text = tok.to_str() or (tok.to_hf_files() or {}).get("tokenizer.json")
    if not text:
        raise CheckpointError("export-gguf: the model's tokenizer has no tokenizer.json form, so GGUF cannot hold "
                              "it; give the model a byte-level BPE (hf) or the bytes tokenizer")
    return json.loads(text)


def tokens_by_id(doc: dict, vocab_size: int) -> tuple[dict[str, int], list[str | None]]:
    """({token: id} of the model's vocabulary and the added tokens, the token of every id up to
    ``vocab_size`` (None where the tokenizer has none)); refused when an id lies beyond it."""
    ids = {**doc["model"]["vocab"], **{t["content"]: t["id"] for t in doc.get("added_tokens", [])}}
    if max(ids.values()) >= vocab_size:
        raise CheckpointError(f"export-gguf: the tokenizer has ids up to {max(ids.values())}, beyond the model's "
                              f"vocab_size {vocab_size}")
    tokens: list[str | None] = [None] * vocab_size
    for token, index in ids.items():
        tokens[index] = token
    return ids, tokens


def vocabulary(model: nn.Module, vocab_size: int) -> dict:
    """The model's tokenizer as GGUF metadata: byte-level BPE, SentencePiece-style BPE or
    WordPiece (see ``write``)."""
    doc = document(model)
    kind = (doc.get("model") or {}).get("type")
    if kind == "WordPiece":
        return wordpiece(doc, vocab_size)
    if kind == "BPE" and doc["model"].get("byte_fallback"):
        return sentencepiece(doc, vocab_size, tokenizer(model))
    if kind == "Unigram":
        return unigram(doc, vocab_size, tokenizer(model))
    return byte_level_bpe(model, vocab_size)


def unigram(doc: dict, vocab_size: int, tok) -> dict:
    """SentencePiece's Unigram in T5's layout as llama.cpp's ``t5`` vocabulary. llama.cpp's
    normaliser applies the precompiled map, then (``remove_extra_whitespaces``) puts one ``▁``
    before each run of non-spaces — what T5's tokenizer.json does with its whitespace split and
    Metaspace — and its Viterbi scores each piece by the log-probability it is given here, with
    SentencePiece's penalty for unknown characters. Special tokens of the vocabulary (T5's
    ``<pad>``, ``</s>``, ``<extra_id_N>``) are control tokens, which llama.cpp finds in text when
    asked to parse special tokens; added tokens beyond it are user-defined."""
    normalizer = doc.get("normalizer") or {}
    steps = normalizer.get("normalizers", [normalizer]) if normalizer else []
    pre = doc.get("pre_tokenizer") or {}
    splits = pre.get("pretokenizers", [pre])
    layout = [p.get("type") for p in splits]
    metaspace = splits[-1] if splits else {}
    normalised = [n.get("type") for n in steps]
    if (normalised not in ([], ["Precompiled"]) or layout != ["WhitespaceSplit", "Metaspace"]
            or metaspace.get("replacement") != SPACE or metaspace.get("prepend_scheme") not in ("always", "first")):
        raise CheckpointError(f"export-gguf: the Unigram tokenizer normalises with {normalised} and "
                              f"splits with {layout}; llama.cpp's t5 vocabulary holds T5's layout (a precompiled "
                              f"character map, a whitespace split, ▁ before every word), which this one is not")
    model = doc["model"]
    if model.get("byte_fallback"):
        raise CheckpointError("export-gguf: the Unigram tokenizer falls back to bytes; llama.cpp's t5 vocabulary "
                              "has no byte fallback (an unknown character is <unk>)")
    pieces = model["vocab"]
    if len(pieces) > vocab_size:
        raise CheckpointError(f"export-gguf: the tokenizer has {len(pieces)} pieces, beyond the model's vocab_size "
                              f"{vocab_size}")
    added = {t["id"]: t for t in doc.get("added_tokens", [])}
    tokens = [piece for piece, _ in pieces] + [f"[PAD{i}]" for i in range(len(pieces), vocab_size)]
    scores = [float(score) for _, score in pieces] + [PADDING_SCORE] * (vocab_size - len(pieces))
    types = [UNKNOWN if i == model.get("unk_id") else CONTROL if i in added and added[i].get("special") else NORMAL
             for i in range(len(pieces))] + [UNUSED] * (vocab_size - len(pieces))
    for index, token in added.items():
        if index >= vocab_size:
            raise CheckpointError(f"export-gguf: the tokenizer has id {index}, beyond the model's vocab_size")
        if index >= len(pieces):
            tokens[index], scores[index], types[index] = token["content"], 0.0, USER_DEFINED
    charsmap = next((n["precompiled_charsmap"] for n in steps if n.get("type") == "Precompiled"), None)
    # the special tokens the post-processor puts around the text (T5: </s> after it)
    special = {i for i, t in added.items() if t.get("special")}
    ends = tok.encode("a")
    bos = ends[0] if len(ends) > 1 and ends[0] in special else None
    eos = ends[-1] if len(ends) > 1 and ends[-1] in special else None
    return {"model": "t5", "tokens": tokens, "scores": scores, "types": types,
            "charsmap": base64.b64decode(charsmap) if charsmap else b"", "unknown": model.get("unk_id"),
            "add_bos": bos is not None, "add_eos": eos is not None, "bos_token_id": bos, "eos_token_id": eos}


#: GGUF's byte tokens: ``<0x00>`` … ``<0xFF>``.
BYTE = 6
SPACE = "\u2581"


def sentencepiece(doc: dict, vocab_size: int, tok) -> dict:
    """SentencePiece-style BPE (Llama 2, Mistral, Gemma, Phi-3: ``▁`` for spaces, a ``▁`` before
    the text, byte fallback) as GGUF's ``llama`` vocabulary: llama.cpp merges the adjacent pair
    whose merged token scores highest, so a merge's rank r becomes its token's score −r, which
    makes the two merge in the same order."""
    steps = [n.get("type") for n in ((doc.get("normalizer") or {}).get("normalizers") or [doc.get("normalizer") or {}])]
    pre = doc.get("pre_tokenizer") or {}
    if steps == ["Prepend", "Replace"] and not pre:
        space_prefix = True
    elif steps in ([None], [], ["Replace"]) and pre.get("type") == "Metaspace" and pre.get("split", True) is not True:
        space_prefix = pre.get("prepend_scheme", "always") != "never"
    else:
        raise CheckpointError(f"export-gguf: the SentencePiece-style tokenizer normalises with {steps} and splits with "
                              f"{pre.get('type')!r}; llama.cpp's llama vocabulary writes ▁ for spaces with a ▁ before "
                              f"the text and no split, which this one does not")
    model = doc["model"]
    ids, tokens = tokens_by_id(doc, vocab_size)
    scores = [0.0] * vocab_size
    for rank, merge in enumerate(model.get("merges", [])):
        merged = "".join(merge.split(" ", 1) if isinstance(merge, str) else merge)
        if merged in ids and scores[ids[merged]] == 0.0:
            scores[ids[merged]] = -float(rank + 1)
    special = {t["id"] for t in doc.get("added_tokens", []) if t.get("special")}
    unknown = model.get("unk_token")
    types = [UNUSED if t is None else BYTE if len(t) == 6 and t.startswith("<0x") and t.endswith(">")
             else 2 if t == unknown else CONTROL if i in special else NORMAL for i, t in enumerate(tokens)]
    adds_bos = tok.bos_id is not None and tok.encode("a")[:1] == [tok.bos_id]
    return {"model": "llama", "tokens": [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)],
            "scores": scores, "types": types, "space_prefix": space_prefix, "add_bos": adds_bos,
            "unknown": ids.get(unknown)}


def wordpiece(doc: dict, vocab_size: int) -> dict:
    """BERT's WordPiece in llama.cpp's spelling, with its lowercasing and accent stripping."""
    piece = doc["model"]
    prefix = piece.get("continuing_subword_prefix", "##")
    normalizer = doc.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        raise CheckpointError(f"export-gguf: the WordPiece tokenizer normalises with {normalizer.get('type')!r}; "
                              f"llama.cpp's bert tokenizer applies BERT's normalizer only")
    special = {t["content"]: t["id"] for t in doc.get("added_tokens", []) if t.get("special")}
    tokens: list[str | None] = [None] * vocab_size
    for token, index in piece["vocab"].items():
        if index >= vocab_size:
            raise CheckpointError(f"export-gguf: the tokenizer has id {index}, beyond the model's vocab_size")
        tokens[index] = token if token in special else token[len(prefix):] if token.startswith(prefix) \
            else "\u2581" + token
    types = [CONTROL if t is not None and i in special.values() else NORMAL if t is not None else UNUSED
             for i, t in enumerate(tokens)]
    lowercase = bool(normalizer.get("lowercase", True))
    strip = normalizer.get("strip_accents")
    return {"model": "bert", "tokens": [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)],
            "types": types, "lowercase": lowercase, "strip_accents": lowercase if strip is None else bool(strip),
            "unknown": piece.get("unk_token", "[UNK]"), "special": special}


def byte_level_bpe(model: nn.Module, vocab_size: int) -> dict:
    """{"tokens", "merges", "types", "pre"} of the model's byte-level BPE, the token list padded
    with unused ``[PAD{i}]`` entries to the embedding's ``vocab_size`` rows (llama.cpp counts the
    vocabulary from the list)."""
    doc = document(model)
    bpe = doc.get("model") or {}
    if bpe.get("type") != "BPE":
        raise CheckpointError(f"export-gguf: the tokenizer is {bpe.get('type')!r}; seqzoo writes GGUF's byte-level BPE "
                              f"(gpt2), SentencePiece-style BPE (llama), Unigram in T5's layout (t5), WordPiece (bert) "
                              f"and the bytes tokenizer")
    ids, tokens = tokens_by_id(doc, vocab_size)
    missing = [i for i, t in enumerate(tokens) if t is None and i < len(ids)]
    if missing:
        raise CheckpointError(f"export-gguf: the vocabulary has no token for ids {few([str(i) for i in missing])}")
    special = {t["id"] for t in doc.get("added_tokens", []) if t.get("special")}
    types = [CONTROL if i in special else NORMAL if t is not None else UNUSED for i, t in enumerate(tokens)]
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]
    return {"model": "gpt2", "tokens": tokens, "merges": merges, "types": types, "pre": pre_name(doc, bool(merges))}


def pre_name(doc: dict, merges: bool) -> str:
    """``tokenizer.ggml.pre`` for the document's pre-tokenizer: ``smollm`` when digits are split
    first, ``gpt-2`` for GPT-2's regex (or for no merges at all, where splits change nothing)."""
    pre = doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    kinds = [p.get("type") for p in steps]
    if kinds == ["ByteLevel"] and (steps[0].get("use_regex", True) or not merges):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    raise CheckpointError(f"export-gguf: the pre-tokenizer {kinds} has no llama.cpp name seqzoo can vouch for "
                          f"(GPT-2's regex: gpt-2; digits split first: smollm)")


def write(writer, vocab: dict, ids: dict) -> None:
    """The tokenizer's metadata: model, pre, tokens, merges or normalizer, types, special ids."""
    writer.add_tokenizer_model(vocab["model"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    if vocab["model"] in ("llama", "t5"):
        writer.add_tokenizer_pre("default")
        writer.add_token_scores(vocab["scores"])
        if vocab["model"] == "llama":
            writer.add_add_space_prefix(vocab["space_prefix"])
        else:  # T5's layout: ▁ before every word, runs of spaces as one
            writer.add_add_space_prefix(True)
            writer.add_remove_extra_whitespaces(True)
            if vocab["charsmap"]:
                writer.add_precompiled_charsmap(vocab["charsmap"])
        if vocab["unknown"] is not None:
            writer.add_unk_token_id(vocab["unknown"])
        for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                         ("pad_token_id", writer.add_pad_token_id)):
            value = ids.get(key) if ids.get(key) is not None else vocab.get(key)  # the model's, else the tokenizer's
            if value is not None:
                add(value)
        writer.add_add_bos_token(vocab["add_bos"])
        writer.add_add_eos_token(vocab.get("add_eos", False))
        return
    if vocab["model"] == "bert":
        writer.add_tokenizer_pre("default")
        writer.add_bool("tokenizer.ggml.normalizer.lowercase", vocab["lowercase"])
        writer.add_bool("tokenizer.ggml.normalizer.strip_accents", vocab["strip_accents"])
        special = vocab["special"]
        for name, token in (("unknown", vocab["unknown"]), ("seperator", "[SEP]"), ("cls", "[CLS]"),
                            ("padding", "[PAD]"), ("mask", "[MASK]")):
            if token in special:
                writer.add_uint32(f"tokenizer.ggml.{name}_token_id", special[token])
        writer.add_add_bos_token(True)  # [CLS] text [SEP], as BERT's own tokenizer encodes
        writer.add_bool("tokenizer.ggml.add_sep_token", True)
        return
    writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_merges(vocab["merges"] or [NEVER_MERGED])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        if ids.get(key) is not None:
            add(ids[key])
    writer.add_add_bos_token(False)


def read_wordpiece(meta: dict) -> str:
    """A ``bert`` vocabulary back as BERT's WordPiece tokenizer.json ([CLS] text [SEP])."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    vocab = {}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == CONTROL:
            vocab[token] = i
        elif kind != UNUSED:
            vocab[token[1:] if token.startswith("\u2581") else "##" + token] = i
    unknown = tokens[meta.get("tokenizer.ggml.unknown_token_id", 100)]
    piece = Tokenizer(models.WordPiece(vocab, unk_token=unknown))
    lowercase = bool(meta.get("tokenizer.ggml.normalizer.lowercase", False))
    piece.normalizer = normalizers.BertNormalizer(
        lowercase=lowercase, strip_accents=bool(meta.get("tokenizer.ggml.normalizer.strip_accents", lowercase)))
    piece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    piece.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t, kind in zip(tokens, types) if kind == CONTROL])
    cls, sep = (meta.get(f"tokenizer.ggml.{n}_token_id") for n in ("cls", "seperator"))
    if cls is not None and sep is not None:
        piece.post_processor = processors.TemplateProcessing(
            single=f"{tokens[cls]} $A {tokens[sep]}", pair=f"{tokens[cls]} $A {tokens[sep]} $B:1 {tokens[sep]}:1",
            special_tokens=[(tokens[cls], cls), (tokens[sep], sep)])
    return piece.to_str()


def read_sentencepiece(meta: dict) -> str:
    """A ``llama`` vocabulary back as SentencePiece-style BPE: merges rebuilt from the scores, as
    transformers rebuilds them from a SentencePiece model (every split of a scored token into two
    tokens, by the merged token's score)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    scores = list(meta.get("tokenizer.ggml.scores", [0.0] * len(tokens)))
    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind != UNUSED}
    found = []
    for token, index in vocab.items():
        if types[index] != NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                found.append((-scores[index], vocab[left], vocab[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(found)]
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    piece = Tokenizer(models.BPE(vocab, merges, unk_token=tokens[unknown] if unknown is not None else None,
                                 byte_fallback=True, fuse_unk=True))
    steps = [normalizers.Replace(" ", SPACE)]
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    if prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    piece.normalizer = normalizers.Sequence(steps)
    # the ▁ put before the text is taken off again; a file without one (Gemma) keeps a leading space
    piece.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                       *([decoders.Strip(" ", 1, 0)] if prefix else [])])
    piece.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t, kind in zip(tokens, types) if kind == CONTROL])
    # user-defined tokens (Gemma's runs of spaces, newlines and tabs, HTML tags) are found in the
    # raw text before the pieces merge, as llama.cpp and SentencePiece find them
    piece.add_tokens([AddedToken(t, special=False, normalized=False)
                      for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", True) and bos is not None:
        piece.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A",
                                                             special_tokens=[(tokens[bos], bos)])
    return piece.to_str()


def read_unigram(meta: dict, where: str) -> str:
    """A ``t5`` vocabulary back as T5's Unigram tokenizer.json: every id's piece and score, the
    precompiled map, a whitespace split and ▁ before every word, control and user-defined tokens
    as special added tokens, ``</s>`` appended where the file says so."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if not meta.get("tokenizer.ggml.remove_extra_whitespaces", False) or \
            not meta.get("tokenizer.ggml.add_space_prefix", True):
        raise CheckpointError(f"{where}: this t5 vocabulary keeps extra whitespace or adds no space prefix; seqzoo "
                              f"rebuilds T5's layout (extra whitespace removed, ▁ before every word) only")
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    scores = [float(s) for s in meta["tokenizer.ggml.scores"]]
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    piece = Tokenizer(models.Unigram(list(zip(tokens, scores)), unk_id=unknown, byte_fallback=False))
    charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        piece.normalizer = normalizers.Precompiled(bytes(bytearray(int(b) & 0xFF for b in charsmap)))
    space = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    piece.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), space])
    piece.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    piece.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t, kind in zip(tokens, types) if kind in (UNKNOWN, CONTROL, USER_DEFINED)])
    bos, eos = (meta.get(f"tokenizer.ggml.{n}_token_id") if meta.get(f"tokenizer.ggml.add_{n}_token", False)
                else None for n in ("bos", "eos"))
    if bos is not None or eos is not None:
        template = ([tokens[bos]] if bos is not None else []) + ["$A"] + ([tokens[eos]] if eos is not None else [])
        piece.post_processor = processors.TemplateProcessing(
            single=" ".join(template), special_tokens=[(tokens[i], i) for i in (bos, eos) if i is not None])
    return piece.to_str()


def read(meta: dict, where: str) -> str:
    """The file's tokenizer as a tokenizers tokenizer.json text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind == "bert":
        return read_wordpiece(meta)
    if kind == "llama":
        return read_sentencepiece(meta)
    if kind == "t5":
        return read_unigram(meta, where)
    if kind != "gpt2":
        raise CheckpointError(f"{where}: tokenizer.ggml.model {kind!r} is not supported; seqzoo rebuilds "
                              f"byte-level BPE (gpt2), SentencePiece-style BPE (llama), Unigram (t5) and WordPiece "
                              f"(bert) tokenizers")
    if pre not in GPT2_PRE + DIGITS_PRE:
        raise CheckpointError(f"{where}: tokenizer.ggml.pre {pre!r} is not supported; supported: "
                              f"{', '.join(GPT2_PRE + DIGITS_PRE)}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind != UNUSED}
    pairs = [tuple(pair.split(" ", 1)) for pair in meta.get("tokenizer.ggml.merges", [])]
    merges = [pair for pair in pairs if "".join(pair) in vocab]  # a merge to no token never applies
    bpe = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if pre in DIGITS_PRE else byte_level)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    return bpe.to_str()
