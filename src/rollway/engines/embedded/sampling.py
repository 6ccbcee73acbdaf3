"""Choosing the next token of each batch row from its logits, with per-row sampling params."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from rollway.errors import EngineError
from rollway.generation import LogprobKind, SamplingParams

#: A temperature or top_p below this samples like its limit: greedy, the top token. Dividing
#: fp32 logits by a smaller temperature overflows to inf, and a smaller top_p rounds to 0 in
#: fp32, leaving no token at all. (vLLM draws the same line: ``_SAMPLING_EPS = 1e-5``.)
SAMPLING_EPS = 1e-5


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A per-request generator, so a seeded request samples the same tokens in any batch."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else random.getrandbits(63))
    return generator


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One sampled token and what a trainer needs of it: its logprob under the distribution it
    was drawn from before any cut (``log_softmax(logits / T)``: see ``logprob_kind``), the
    temperature-1 logprob, and the mass top-p/top-k kept (1.0: no cut)."""

    token: int
    logprob: float
    raw_logprob: float
    kept_mass: float = 1.0
    #: The ``sampling.top_logprobs`` most likely ids and their logprobs (None: not asked).
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None
    #: The entropy of the distribution ``logprob`` is taken from (None: not asked).
    entropy: float | None = None


def is_greedy(sampling: SamplingParams) -> bool:
    return sampling.temperature < SAMPLING_EPS or sampling.top_p < SAMPLING_EPS


def logprob_kind(sampling: SamplingParams) -> LogprobKind:
    """What ``choose_token``'s logprobs are under ``sampling``: the temperature's distribution,
    which is the raw one at temperature 1 and when greedy (sampled as the argmax)."""
    raw = is_greedy(sampling) or sampling.temperature == 1.0
    return "raw_logprobs" if raw else "processed_logprobs"


def cuts(sampling: SamplingParams) -> bool:
    """Whether top-p or top-k may leave fewer tokens to sample from than the vocabulary."""
    return not is_greedy(sampling) and (sampling.top_k > 0 or sampling.top_p < 1.0)


def choose_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
) -> SampledToken:
    """Sample one token id from a 1-D fp32 ``logits`` row under ``sampling``; raises
    ``EngineError`` when the row holds NaN (it would yield an arbitrary token)."""
    if bool(torch.isnan(logits).any()):
        raise EngineError("the model's logits hold NaN")
    raw = torch.log_softmax(logits, dim=-1)
    if is_greedy(sampling):
        token = int(torch.argmax(logits).item())
        logprob = float(raw[token].item())
        return SampledToken(token, logprob, logprob, 1.0, *_extras(raw, sampling))
    scaled, scaled_logprobs = logits, raw
    if logprob_kind(sampling) == "processed_logprobs":
        scaled = logits / sampling.temperature
        scaled_logprobs = torch.log_softmax(scaled, dim=-1)
    filtered = scaled
    if 0 < sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if sampling.top_p < 1.0:
        filtered = _filter_top_p(filtered, sampling.top_p)
    kept = 1.0
    if filtered is not scaled:
        kept = float(scaled_logprobs.exp()[torch.isfinite(filtered)].sum().item())
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator).item())
    logprob = float(scaled_logprobs[token].item())
    extras = _extras(scaled_logprobs, sampling)
    return SampledToken(token, logprob, float(raw[token].item()), min(kept, 1.0), *extras)


def _extras(
    logprobs: torch.Tensor, sampling: SamplingParams
) -> tuple[list[int] | None, list[float] | None, float | None]:
    """The top logprobs and the entropy of one step's distribution, where ``sampling`` asks."""
    top_ids = top_values = entropy = None
    if sampling.top_logprobs:
        top = torch.topk(logprobs, min(sampling.top_logprobs, logprobs.shape[-1]))
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    if sampling.record_entropy:
        # Tokens of probability 0 (logprob -inf) add nothing: 0 * -inf would be NaN.
        probs = logprobs.exp()
        terms = torch.where(probs > 0, probs * logprobs, torch.zeros_like(probs))
        entropy = max(0.0, -float(terms.sum().item()))
    return top_ids, top_values, entropy


def _filter_top_p(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(scaled, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Drop a token when the tokens before it already hold top_p of the mass; the first stays.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop_sorted[0] = False
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))
