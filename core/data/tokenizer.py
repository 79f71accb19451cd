"""The tokenizers a corpus is prepared with: ``bytes``, a ``tokenizer.json`` or a seqzoo checkpoint's
own (``resolve_tokenizer``), and a byte-level BPE trained on a corpus's training split with Hugging
Face ``tokenizers`` (``train_bpe``), so raw text becomes a BPE model's shards in two commands.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from ..files import write_text_atomic
from ..io.checkpoint import read_metadata, read_recipe
from ..registry import registry, tokenizer
from .prepare import TokenizerInfo, held_out, held_out_count
from .shards import DataError
from .sources import count_documents, documents, find_sources

#: Special tokens that end a document, in the order they are looked for in a tokenizer.json.
END_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|eos|>", "<eos>")
#: The end token of the BPE tokenizers ``train_bpe`` writes (GPT-2's), id 0.
END_TOKEN = "<|endoftext|>"


def resolve_tokenizer(argument: str) -> TokenizerInfo:
    """``bytes`` (or another registered tokenizer's name), a ``tokenizer.json`` (or a folder with
    one), or a seqzoo checkpoint (``.safetensors``: the tokenizer it was trained with)."""
    path = Path(argument).expanduser()
    if argument.endswith(".safetensors"):
        metadata = read_metadata(path)
        recipe = read_recipe(path, metadata)
        state = metadata.get("seqzoo.tokenizer")
        spec = recipe.get("tokenizer", "bytes")
        spec = {"kind": spec} if isinstance(spec, str) else dict(spec)
        return TokenizerInfo(tokenizer(recipe, state=state), spec, state if spec["kind"] == "hf" else None)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.suffix == ".json" or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(f"--tokenizer {argument}: cannot read it ({error}); give bytes, a tokenizer.json or a "
                            f"seqzoo checkpoint") from None
        specials = _special_tokens(argument, text)
        end = next((specials[t] for t in END_TOKENS if t in specials), None)
        if end is None:
            found = ", ".join(sorted(specials)) or "none"
            raise DataError(f"--tokenizer {argument}: it declares no end-of-document token ({', '.join(END_TOKENS)}; "
                            f"its special tokens: {found}), which prepare puts between documents")
        params = {"path": str(path), "eos_id": end}
        return TokenizerInfo(registry().get("tokenizer", "hf").cls.from_str(text, **params), {"kind": "hf", **params},
                             text)
    if argument in {c.name for c in registry().list("tokenizer")}:
        return TokenizerInfo(registry().create("tokenizer", argument), {"kind": argument})
    raise DataError(f"--tokenizer {argument}: not a registered tokenizer, a tokenizer.json or a seqzoo "
                    f"checkpoint (.safetensors)")


def _special_tokens(argument: str, text: str) -> dict[str, int]:
    """{text: id} of the special tokens a tokenizer.json declares."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("a tokenizer.json needs the tokenizers package: pip install 'seqzoo[data]'") from None
    try:
        backend = Tokenizer.from_str(text)
    except Exception as error:  # the Rust side raises plain Exceptions
        raise DataError(f"--tokenizer {argument}: not a valid tokenizer.json ({error})") from None
    return {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}


def training_text(arguments: list[str], *, val: float, field: str, glob: str | None, exclude: tuple[str, ...] = (),
                  log: Callable[[str], None]) -> Iterator[str]:
    """The text of the training split that ``prepare`` with the same settings would write: the
    documents not held out; for a corpus of one document, its first ``1 − val`` by characters
    (prepare cuts by tokens, so the two differ by at most a piece's worth)."""
    sources = find_sources(arguments, glob, exclude)
    counts = [count_documents(s, field) for s in sources]
    total = sum(counts)
    if total == 0:
        raise DataError(f"the corpus is empty: {', '.join(arguments)} hold no document")
    held = held_out_count(total, val)
    if total == 1:
        source = next(s for s, c in zip(sources, counts) if c)
        keep = int(source.size() * (1 - val))
        seen = 0
        for text, _ in documents(source, field, log):
            yield text[:max(0, keep - seen)]
            seen += len(text)
        return
    index = 0
    for source in sources:
        for text, ends in documents(source, field, log):
            if not held_out(index, total, held):
                yield text
            index += ends


def train_bpe(arguments: list[str], output: str | Path, vocab_size: int, *, val: float = 0.1, field: str = "text",
              glob: str | None = None, exclude: tuple[str, ...] = (), min_frequency: int = 2,
              log: Callable[[str], None] = print) -> dict:
    """Train a byte-level BPE (GPT-2's pre-tokenizer and byte alphabet, ``<|endoftext|>`` = 0) on
    the corpus's training split and write its tokenizer.json; returns the recipe ``tokenizer:``
    spec that uses it."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise DataError("training a BPE needs the tokenizers package: pip install 'seqzoo[data]'") from None
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise DataError(f"--vocab {vocab_size}: a byte-level BPE needs at least {len(alphabet) + 1} ids (the "
                        f"{len(alphabet)} bytes and the end token)")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[END_TOKEN],
                                  initial_alphabet=alphabet, show_progress=False)
    bpe.train_from_iterator(training_text(arguments, val=val, field=field, glob=glob, exclude=exclude, log=log),
                            trainer)
    path = Path(output).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.parent.is_dir():
        raise DataError(f"-o {output}: the folder {path.parent} does not exist")
    write_text_atomic(path, bpe.to_str(pretty=True) + "\n")
    end = bpe.token_to_id(END_TOKEN)
    size = bpe.get_vocab_size(with_added_tokens=True)
    if size < vocab_size:
        log(f"--vocab {vocab_size}: the training text has merges for {size} ids only (pairs seen at least "
            f"{min_frequency} times); the tokenizer has {size}")
    return {"kind": "hf", "path": str(path), "eos_id": end, "bos_id": end, "pad_id": end, "vocab_size": size}
