"""llama.cpp as the judge of GGUF files (tests/test_gguf_llama_cpp.py and each family's GGUF test):
a random model made decisive, seqzoo's and llama.cpp's logits and greedy tokens on the same ids, and
the criteria that compare them. Needs numpy and llama-cpp-python (``pip install 'seqzoo[llama-cpp]'``),
imported when called."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch

from . import parity

if TYPE_CHECKING:
    import numpy as np

#: Routers scaled so a token's experts are clear: a softmax router by 30, a sigmoid one (DeepSeek's)
#: by 5, as more would saturate it into ties between experts scoring 1.0.
ROUTER_SCALE = {"softmax": 30, "sigmoid": 5}
PROMPT = list(b"The interpreter reads the program and runs it, line by line.")  # byte ids
STEPS = 32


def decisive(model: torch.nn.Module) -> torch.nn.Module:
    """Norm weights and biases drawn away from their initial values (a misplaced one shows), the
    final norm scaled so the logits spread over a few units and the routers so each token's experts
    are clear: a random model's near-ties would make decoding and routing coin tosses under any
    rounding."""
    parity.randomised(model)
    scale = ROUTER_SCALE["sigmoid" if "sigmoid" in json.dumps(model.recipe["model"]) else "softmax"]
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("router.weight"):
                parameter.mul_(scale)
        weight = model.state_dict()["decoder.final_norm.weight"]
        gemma = model.recipe["model"]["norm"]["kind"] == "gemma_rmsnorm"
        weight.copy_((1 + weight) * 8 - 1 if gemma else weight * 8)
    return model


def seqzoo_run(model, ids: list[int]) -> tuple[np.ndarray, list[int]]:
    """(logits of the prompt (T, V), 32 greedy tokens), by full forwards."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].float().numpy()
        sequence = list(ids)
        for _ in range(STEPS):
            sequence.append(int(model(torch.tensor([sequence]))[0, -1].argmax()))
    return logits, sequence[len(ids):]


def llama_cpp_run(path, ids: list[int], vocab: int) -> tuple[np.ndarray, list[int]]:
    """(llama.cpp's logits of the prompt (T, V), 32 greedy tokens by its own cache), one thread."""
    import llama_cpp
    import numpy as np

    # A float32 KV cache: llama.cpp's default F16 cache alone moves logits by ~1e-3.
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=128, logits_all=True, verbose=False,
                          n_threads=1, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids), :vocab])
    greedy = []
    for _ in range(STEPS):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1, :vocab]))
        greedy.append(token)
        llm.eval([token])
    return logits, greedy


#: llama.cpp's CPU GELU rounds its input to FP16 and reads a table (ggml's GGML_GELU_FP16), which
#: moves a Gemma 3 of six GeGLU layers by up to 2e-3 of the largest logit: its check uses two layers.
#: type -> (a top-2 margin, as a share of the largest logit, beyond llama.cpp's rounding of the
#: activations; the median logit difference it leaves), measured on these models.
NOISE = {"F16": (0.01, 2e-3), "Q8_0": (0.1, 5e-2)}


def judge(family: str, kind: str, logits: np.ndarray, greedy: list[int], theirs: np.ndarray,
          their_greedy: list[int]) -> None:
    """seqzoo's (logits, greedy tokens) against llama.cpp's on a random model: exact criteria for
    F32, noise-aware ones for the rounded types."""
    import numpy as np

    largest = np.abs(logits).max()
    error = np.abs(theirs - logits).max(-1) / largest
    if kind == "F32":
        assert error.max() <= 1e-3, f"{family}: logits differ by {error.max():.2e} of the largest"
        assert their_greedy == greedy, f"{family}: greedy tokens differ"
        return
    # llama.cpp rounds the activations too for F16 (to F16) and Q8_0 (to 8-bit blocks), so a random
    # model's near-ties (top-2 margins under the type's noise) may flip; decisive positions may not.
    noise, typical = NOISE[kind]
    assert np.median(error) <= typical, f"{family} {kind}: logits differ by {np.median(error):.2e} (median)"
    top2 = np.sort(logits, -1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) / largest > noise
    same = theirs.argmax(-1) == logits.argmax(-1)
    assert same[decided].all(), f"{family} {kind}: top-1 differs where seqzoo's margin exceeds {noise:.0%}"
    assert same.mean() >= 0.9, f"{family} {kind}: top-1 differs at {1 - same.mean():.0%} of the positions"
    if kind == "F16":  # F16's rounding leaves every family's 32 greedy tokens as they were
        assert their_greedy == greedy, f"{family} F16: greedy tokens differ"


