"""Autoregressive generation: greedy, temperature, top-k and top-p sampling, with a KV cache.

A model generates through the ``LanguageModel`` contract (``seqzoo.interfaces``):
``model.start_generation(input_ids, max_new_tokens, use_cache)`` returns a ``DecodeSession``;
``session.next(tokens)`` feeds the tokens just chosen (None for the prompt) and returns the logits
(B, V) of the next position; ``session.prefix`` (B, T0) is what the output starts with (the prompt
for decoder-only models, the decoder start token for seq2seq ones). ``CausalSession`` serves
decoder-only models.
"""
from __future__ import annotations

import math
import types
import warnings
import weakref

import torch
from torch import Tensor, nn

from ..errors import InputError, SeqzooError
from ..interfaces import LanguageModel, Model, RopeScaling
from ..registry import tokenizer
from .blocks import check_position_limit


class CausalSession:
    """Decoding state of a decoder-only model: its KV cache, or (``use_cache=False``) the whole
    sequence so far, recomputed every step (kept as the reference the cached path must equal).

    ``static``: after the prompt the cache turns static (``DecodeCache.make_static``) — every step has
    the same shapes; ``compile`` (implies static) runs those steps through ``torch.compile``.
    """

    def __init__(self, model: nn.Module, input_ids: Tensor, max_new_tokens: int, use_cache: bool,
                 attention_mask: Tensor | None = None, *, static: bool = False, compile: bool = False) -> None:
        self.model = model
        self.prefix = self.ids = input_ids
        self.mask = attention_mask
        self.static = static or compile
        self.step = _compiled_decode_step(model) if compile else _decode_step
        if self.static and not use_cache:
            raise InputError("static and compiled decoding need the KV cache (use_cache=True)")
        max_len = input_ids.shape[1] + max_new_tokens
        if self.static:  # a few fixed lengths, so prompts of nearby lengths share a compiled step
            max_len = -(-max_len // STATIC_LENGTH_STEP) * STATIC_LENGTH_STEP
        self.cache = model.new_cache(input_ids.shape[0], max_len) if use_cache else None
        self.next_position: Tensor | None = None
        # Cache lengths at which a RoPE scaling makes the cached keys stale (LongRoPE's L): the
        # step there re-encodes the whole sequence, so the session keeps it (and its mask).
        self.stale_at = {m.stale_after for m in model.modules()
                         if isinstance(m, RopeScaling) and m.stale_after is not None} if use_cache else set()

    def next(self, tokens: Tensor | None) -> Tensor:
        """tokens (B,) chosen last step, or None for the prompt -> logits (B, V) in float32."""
        whole = tokens is None or self._extend(tokens[:, None])  # feed the whole sequence?
        if self.next_position is not None:  # a static step: fixed shapes, positions given
            self.cache.check_room(1)
            check_position_limit(self.model.max_positions, self.cache.length + 1)
            logits = self.step(self.model, tokens[:, None], self.next_position, self.cache)
            self.cache.step_static()
            self.next_position += 1
            return logits
        feed = self.ids if whole else tokens[:, None]
        logits = self.model(feed, attention_mask=self.mask, cache=self.cache, logits_to_keep=1)
        if self.static:  # the prompt is in: every later step has the same shapes
            self.cache.make_static(self.mask)
            if self.mask is None:
                self.next_position = torch.full((1, 1), feed.shape[1], device=feed.device)
            else:  # positions count real tokens only (left padding)
                self.next_position = self.mask.long().sum(-1, keepdim=True)
        return logits[:, -1].float()

    def _extend(self, new: Tensor) -> bool:
        """Record the tokens new (B, 1) in the mask and, when the session keeps it, the sequence.
        True when the whole sequence must be fed: without a cache (the uncached reference), or
        when the cache just went stale — then it starts afresh, as transformers' Phi-3 drops its
        cache at the step that takes the sequence past LongRoPE's L."""
        keep = self.cache is None or bool(self.stale_at)
        if self.mask is not None and (self.next_position is None or keep):  # static steps need no mask
            self.mask = torch.cat([self.mask, self.mask.new_ones(new.shape)], dim=1)
        if keep:
            self.ids = torch.cat([self.ids, new], dim=1)
        if self.cache is not None and self.cache.length in self.stale_at:
            self.cache = self.model.new_cache(self.ids.shape[0], self.cache.max_len)
            self.next_position = None  # a static session turns static again after this step
            return True
        return self.cache is None

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` in that order (beam search)."""
        if self.cache is None or self.stale_at:
            self.ids = self.ids.index_select(0, rows)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, rows)
        if self.cache is not None:
            self.cache.reorder(rows)
        if self.next_position is not None and self.next_position.shape[0] > 1:
            self.next_position = self.next_position.index_select(0, rows)


#: Static caches are sized up to a multiple of this many tokens.
STATIC_LENGTH_STEP = 32


def _decode_step(model: nn.Module, tokens: Tensor, positions: Tensor, cache) -> Tensor:
    """One static decode step: tokens (B, 1) at positions (B|1, 1) -> next-token logits (B, V)."""
    return model(tokens, positions=positions, cache=cache, logits_to_keep=1)[:, -1].float()


#: The compiled decode step of each model, with the versions of the weights it was compiled for,
#: made at its first compiled generation and reused by every later one while the weights stay as
#: they were (dynamo keeps one graph per batch size and cache length).
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled_decode_step(model: nn.Module):
    """``_decode_step`` through torch.compile for ``model``, with inductor's ``freezing``: the
    weights become constants of the graph, folded into what is computed from them once (a bfloat16
    linear layer's weight is packed into oneDNN's layout; float32's products stay MKL products on
    the weights as they are) instead of every token (SmolLM2-135M in float32 on an AMD EPYC: 33–36
    -> 42–45 tokens/s in one session's A/B; docs/performance.md). Packed copies live beside the
    model's own weights while the step is kept. A frozen graph does not see later changes of the
    weights, so it is kept with their versions (every in-place update, an optimizer step or a load,
    bumps one) and compiled afresh when they moved. Freezing inlines parameters only: buffers (an
    int8-dynamic layer's codes and scales) stay inputs of the graph, read afresh every step. Each
    model gets a copy of the function with a code object of its own: dynamo's graphs and its
    recompile limit (8) belong to a code object, so one shared step ran out of graphs after a few
    models in one process (a benchmark, a server) and silently fell back to eager decoding."""
    versions = tuple((id(p), p._version) for p in model.parameters())
    kept = _COMPILED.get(model)
    if kept is None or kept[0] != versions:
        code = _decode_step.__code__.replace()  # an equal code object that is not the same one
        own = types.FunctionType(code, _decode_step.__globals__, _decode_step.__name__)
        kept = _COMPILED[model] = (versions, torch.compile(own, dynamic=False, options={"freezing": True}))
    return kept[1]


def choose(logits: Tensor, *, temperature: float, top_k: int | None, top_p: float | None,
           generator: torch.Generator | None) -> Tensor:
    """Pick the next token for each row of logits (B, V) -> (B,)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked before it already hold top_p of the mass; the
        # most likely token always stays.
        drop = probs.cumsum(dim=-1) - probs > top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class _FromTokenizer:
    """The default ``eos_id``: the end token of the model's own tokenizer."""

    def __repr__(self) -> str:
        return "the tokenizer's eos"


FROM_TOKENIZER = _FromTokenizer()


def model_eos(model: nn.Module) -> int | None:
    """The eos id of the tokenizer a model's recipe names (None without a recipe or an eos)."""
    if not isinstance(model, Model) or model.recipe is None or "tokenizer" not in model.recipe:
        return None
    try:
        return tokenizer(model).eos_id
    except SeqzooError:  # a tokenizer file that is gone: generate without a stop token
        return None


def generate(model: nn.Module, input_ids: Tensor | list[Tensor], max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             eos_id: int | None | _FromTokenizer = FROM_TOKENIZER, seed: int | None = None,
             attention_mask: Tensor | None = None, beam_size: int | None = None,
             length_penalty: float = 1.0, compile: bool = False) -> Tensor | list[Tensor]:
    """Continue ``input_ids`` (B, T) by up to ``max_new_tokens`` tokens -> (B, T + new).

    For encoder–decoder models ``input_ids`` is the source and the output is the decoded target
    (B, 1 + new), starting with the decoder start token.

    temperature 0 is greedy; otherwise sample from softmax(logits / temperature), keeping the
    ``top_k`` most likely tokens and/or the smallest set holding ``top_p`` of the mass. After a
    row emits ``eos_id`` it keeps emitting it (the rows that finished first are padded with it);
    generation stops early once every row has. ``eos_id`` defaults to the end token of the
    model's tokenizer (the recipe's ``tokenizer:``, as ``seqzoo.load`` and ``seqzoo.build``
    give it); ``eos_id=None`` never stops early.

    A model with a learned position table (``model.max_positions``) cannot read past it: a prompt
    longer than the table is refused, and when ``max_new_tokens`` would run past it, generation
    stops at the table's end with a one-line warning and returns what it made.
    ``seed`` makes sampling reproducible. ``use_cache=False`` recomputes the prefix every step.
    ``beam_size`` switches to beam search (``length_penalty`` α ranks finished hypotheses by
    log p / length^α; beam 1 is greedy); it does not sample, so it refuses temperature, top_k and
    top_p.

    ``compile`` (decoder-only models): after the prompt, decode with a static KV cache, each step
    compiled by ``torch.compile`` — the same tokens, faster per token; the first call for a model
    structure, batch size and (rounded) length pays the compilation (seconds to tens of seconds
    on a CPU), later ones reuse it; its weights are packed for the BLAS once (a second copy of
    them in memory while the step is kept). torch keeps up to ``torch._dynamo.config.recompile_limit``
    (8) such graphs; shapes beyond that decode eagerly, with torch's warning.

    A list of 1-D prompts of any lengths is padded into one batch (on the side the model masks:
    ``model.prompt_padding``) and answered with a list of 1-D tensors — each prompt (the decoder
    start token for seq2seq models) followed by its new tokens, up to and including ``eos_id``,
    with no padding; each equals what generating that prompt alone gives.
    """
    if not isinstance(model, LanguageModel):
        raise InputError(f"{type(model).__name__} does not generate: it is not a "
                         f"seqzoo.interfaces.LanguageModel")
    if eos_id is FROM_TOKENIZER:
        eos_id = model_eos(model)
    with torch.inference_mode():
        out = _generate(model, input_ids, max_new_tokens, use_cache=use_cache, temperature=temperature,
                        top_k=top_k, top_p=top_p, eos_id=eos_id, seed=seed, attention_mask=attention_mask,
                        beam_size=beam_size, length_penalty=length_penalty, compile=compile)
    # Plain tensors out (a copy of B·T ids): inference-mode tensors cannot enter autograd, and
    # generated ids are often fed straight back into a training step.
    return [row.clone() for row in out] if isinstance(out, list) else out.clone()


def _generate(model: nn.Module, input_ids: Tensor | list[Tensor], max_new_tokens: int, *, use_cache: bool,
              temperature: float, top_k: int | None, top_p: float | None, eos_id: int | None,
              seed: int | None, attention_mask: Tensor | None, beam_size: int | None,
              length_penalty: float, compile: bool) -> Tensor | list[Tensor]:
    if isinstance(input_ids, (list, tuple)):
        return _generate_list(model, list(input_ids), max_new_tokens, use_cache=use_cache,
                              temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id,
                              seed=seed, beam_size=beam_size, length_penalty=length_penalty,
                              compile=compile)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise InputError(f"input_ids must be (B, T) with T >= 1, got shape {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):  # NaN passes `< 0` and poisons softmax
        raise InputError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {top_p}")
    if beam_size is not None and beam_size < 1:
        raise InputError(f"beam_size must be >= 1, got {beam_size}")
    if not math.isfinite(length_penalty):  # a NaN score would rank the hypotheses arbitrarily
        raise InputError(f"length_penalty must be a finite number, got {length_penalty}")
    if beam_size is not None and (temperature != 0 or top_k is not None or top_p is not None):
        raise InputError(f"beam search (beam_size={beam_size}) keeps the most likely hypotheses and does "
                         f"not sample; drop temperature/top_k/top_p, or drop beam_size to sample")
    if compile and beam_size is not None:
        raise InputError("compile=True decodes greedily or by sampling; beam search runs eagerly")
    if compile and not model.supports_compile:
        raise InputError(f"compile=True needs a decoder-only model with a static KV cache; "
                         f"{type(model).__name__} decodes eagerly only")
    max_new_tokens = _fit_position_limit(model, input_ids.shape[1], max_new_tokens)
    if max_new_tokens == 0:
        return input_ids
    was_training = model.training
    model.eval()
    if beam_size is not None:
        try:
            return beam_search(model, input_ids, max_new_tokens, beam_size=beam_size, eos_id=eos_id,
                               length_penalty=length_penalty, use_cache=use_cache,
                               attention_mask=attention_mask)
        finally:
            model.train(was_training)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    options = {"compile": True} if compile else {}
    session = model.start_generation(input_ids, max_new_tokens, use_cache, attention_mask=attention_mask,
                                     **options)
    out = [session.prefix]
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    token = None
    try:
        for _ in range(max_new_tokens):
            logits = session.next(token)
            token = choose(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            if eos_id is not None:
                token = token.masked_fill(done, eos_id)
                done |= token == eos_id
            out.append(token[:, None])
            if eos_id is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return torch.cat(out, dim=1)


def _fit_position_limit(model: nn.Module, prompt: int, max_new_tokens: int) -> int:
    """How many new tokens a decoder-only model with a learned position table can make after a
    ``prompt``-token prompt: the last token it makes is never fed back, so the sequence may end
    one past the table. A prompt that does not fit is refused up front."""
    limit = model.max_positions
    if limit is None or model.family == "seq2seq":  # seq2seq outputs do not continue the prompt
        return max_new_tokens
    if prompt > limit:
        raise InputError(f"the prompt has {prompt} tokens but the model reads at most {limit} positions "
                         f"(its learned position table, model.max_seq_len={limit}); shorten the prompt")
    room = limit + 1 - prompt
    if max_new_tokens > room:
        warnings.warn(f"stopping after {room} new tokens instead of {max_new_tokens}: a {prompt}-token "
                      f"prompt leaves room for {room} before the model's {limit}-position limit "
                      f"(model.max_seq_len)", stacklevel=4)
        return room
    return max_new_tokens


def _generate_list(model: nn.Module, prompts: list[Tensor], max_new_tokens: int, **kwargs) -> list[Tensor]:
    if not prompts:
        return []
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, Tensor) or prompt.dim() != 1 or prompt.numel() == 0:
            shape = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
            raise InputError(f"prompt {index}: each prompt must be a non-empty 1-D tensor of ids, got {shape}")
    eos_id = kwargs.get("eos_id")
    side = model.prompt_padding
    if side is None:  # the model cannot mask padding: batch prompts of equal length only
        groups: dict[int, list[int]] = {}
        for index, prompt in enumerate(prompts):
            groups.setdefault(len(prompt), []).append(index)
        batches = list(groups.values())
    else:
        batches = [list(range(len(prompts)))]
    results: list[Tensor | None] = [None] * len(prompts)
    for batch in batches:
        lengths = [len(prompts[i]) for i in batch]
        width = max(lengths)
        device = prompts[batch[0]].device
        ids = torch.zeros(len(batch), width, dtype=torch.long, device=device)
        mask = torch.zeros(len(batch), width, dtype=torch.long, device=device)
        for row, (index, length) in enumerate(zip(batch, lengths)):
            span = slice(width - length, width) if side == "left" else slice(0, length)
            ids[row, span] = prompts[index]
            mask[row, span] = 1
        out = _generate(model, ids, max_new_tokens, attention_mask=mask if side else None, **kwargs)
        prefix = 1 if model.family == "seq2seq" else width  # seq2seq output starts at the decoder
        for row, (index, length) in enumerate(zip(batch, lengths)):
            head = out[row, :prefix] if prefix != width else out[row, width - length:width]
            new = out[row, prefix:]
            if eos_id is not None and bool((new == eos_id).any()):
                new = new[: int((new == eos_id).nonzero()[0]) + 1]
            results[index] = torch.cat([head, new])
    return results  # type: ignore[return-value]


def beam_search(model: nn.Module, input_ids: Tensor, max_new_tokens: int, *, beam_size: int,
                eos_id: int | None = None, length_penalty: float = 1.0, use_cache: bool = True,
                attention_mask: Tensor | None = None) -> Tensor:
    """Beam search over ``beam_size`` hypotheses per row -> (B, T0 + L), the best hypothesis per
    row after the session's prefix, shorter ones padded with ``eos_id``.

    Every step extends each live beam by every token, keeps the ``beam_size`` best live
    continuations (by summed log-probability) and retires those that end in ``eos_id`` into a
    finished list ranked by log p / length^α. A row is done once it holds ``beam_size`` finished
    hypotheses; at the end, live beams compete with the finished ones.
    """
    b, k = input_ids.shape[0], beam_size
    rows = torch.arange(b, device=input_ids.device).repeat_interleave(k)  # each row k times
    mask = attention_mask.index_select(0, rows) if attention_mask is not None else None
    session = model.start_generation(input_ids.index_select(0, rows), max_new_tokens, use_cache,
                                     attention_mask=mask)
    prefix = session.prefix
    scores = torch.full((b, k), float("-inf"), device=input_ids.device)
    scores[:, 0] = 0.0  # all beams start identical: only one may expand at first
    history = torch.empty(b * k, 0, dtype=torch.long, device=input_ids.device)
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(b)]
    done = [False] * b
    token = None
    for step in range(max_new_tokens):
        logits = session.next(token)  # (B·k, V)
        vocab = logits.shape[-1]
        candidates = (scores[:, :, None] + logits.log_softmax(-1).view(b, k, vocab)).view(b, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2k)
        origin = top_index // vocab
        tokens = top_index % vocab
        next_scores = torch.full((b, k), float("-inf"), device=scores.device)
        next_origin = torch.zeros(b, k, dtype=torch.long, device=scores.device)
        next_tokens = torch.zeros(b, k, dtype=torch.long, device=scores.device)
        for row in range(b):
            live = 0
            for score, src, tok in zip(top_scores[row].tolist(), origin[row].tolist(), tokens[row].tolist()):
                if done[row] or live == k or score == float("-inf"):
                    break
                if eos_id is not None and tok == eos_id:
                    sequence = torch.cat([history[row * k + src], history.new_tensor([tok])])
                    finished[row].append((score / (step + 1) ** length_penalty, sequence))
                    if len(finished[row]) >= k:
                        done[row] = True
                    continue
                next_scores[row, live], next_origin[row, live], next_tokens[row, live] = score, src, tok
                live += 1
        if all(done):
            break
        flat = (torch.arange(b, device=scores.device)[:, None] * k + next_origin).view(-1)
        session.reorder(flat)
        history = torch.cat([history.index_select(0, flat), next_tokens.view(-1, 1)], dim=1)
        scores = next_scores
        token = next_tokens.view(-1)
    best = []
    for row in range(b):
        pool = list(finished[row])
        if not done[row]:
            length = history.shape[1]
            pool += [(scores[row, j].item() / max(length, 1) ** length_penalty, history[row * k + j])
                     for j in range(k) if scores[row, j] > float("-inf")]
        best.append(max(pool, key=lambda item: item[0])[1])
    width = max(len(seq) for seq in best)
    fill = eos_id if eos_id is not None else 0
    out = torch.full((b, width), fill, dtype=torch.long, device=input_ids.device)
    for row, seq in enumerate(best):
        out[row, : len(seq)] = seq
    return torch.cat([prefix.index_select(0, torch.arange(0, b * k, k, device=prefix.device)), out], dim=1)
