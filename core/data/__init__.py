"""The data layer: corpora become token shards once (``prepare``), training reads fixed-length
windows from them through a deterministic sampler (``shards``). It sits between ``io`` (a
checkpoint's tokenizer) and ``train``; nothing in ``nn`` knows about it."""
