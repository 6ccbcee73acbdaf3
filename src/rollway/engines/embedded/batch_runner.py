"""The embedded engine's forward passes, on its worker thread only.

Requests join the running batch (``admit``: prefill past the prefix whose KV they reuse, then
merge), decode a step at a time (``step``), sample under their own params and generator, and
leave it as soon as they are done (``retire``). The prefix cache keeps each prompt's KV once
it is computed and each finished row's KV when it leaves. The engine
decides when each of these runs; this module owns the tensors.

A request is answered once (its ``future``) or, streamed, in chunks (its ``chunks`` queue):
the worker hands a streamed row the tokens it sampled since its last chunk between two forward
passes (``publish``), and its last chunk, with the finish reason, when it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

from rollway.engines.embedded.decode_batch import DecodeBatch, Reuse, extend_prefix
from rollway.engines.embedded.kv_cache import CachedPrefix, PrefixCache, common_prefix_length
from rollway.engines.embedded.sampling import choose_token, cuts, logprob_kind
from rollway.engines.whole_text import WholeText
from rollway.errors import ConfigError, EngineError
from rollway.generation import FinishReason, GenerationChunk, GenerationResult, SamplingParams

#: Shorter shared prefixes are not worth a separate forward pass.
MIN_SHARED_PREFIX = 16


@dataclass(eq=False)
class Request:
    """One generation in flight: its prompt, what it sampled so far and how it ended."""

    request_id: str
    input_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    #: Answered once here; None for a streamed request, answered through ``chunks``.
    future: asyncio.Future[GenerationResult] | None
    generator: torch.Generator
    #: A streamed request's chunks (an error instead of the last one if it fails), put on
    #: ``loop`` as the worker samples them.
    chunks: asyncio.Queue[GenerationChunk | BaseException] | None = None
    #: Output tokens already handed out in chunks (the worker's count).
    streamed: int = 0
    #: ``input_ids`` as a tensor, to match and slice prefixes.
    prompt: torch.Tensor = field(init=False)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: The temperature-1 logprobs, kept where ``logprobs`` are the temperature's.
    raw_logprobs: list[float] = field(default_factory=list)
    #: The mass top-p/top-k kept for each output id (filled only where the sampling cuts).
    kept_mass: list[float] = field(default_factory=list)
    #: Per output id, where the sampling asks: the top ids, their logprobs, the entropy.
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    #: The weights version that sampled each output id.
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    #: Set by ``abort`` (or ``pause("abort")``); the worker ends the row at its next step.
    abort_requested: bool = False
    #: Answered (its result or last chunk is on its way); the worker answers each row once.
    settled: bool = False
    #: Set when this row alone failed; its batch goes on without it.
    error: BaseException | None = None
    #: The weights version that prefilled this row's KV (-1: not prefilled).
    kv_version: int = -1
    #: The output's text in whole characters, for its stop strings (made when first needed).
    text: WholeText | None = None

    def __post_init__(self) -> None:
        self.prompt = torch.tensor(self.input_ids, dtype=torch.long)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def finish(self, reason: FinishReason) -> None:
        self.finish_reason = reason

    def publish(self) -> None:
        """Hand a streamed request the tokens sampled since its last chunk (worker thread)."""
        if self.chunks is not None and self.streamed < len(self.output_ids):
            self._call_soon(self.chunks.put_nowait, self._next_chunk(None))

    def resolve(self) -> None:
        if self.chunks is not None:
            error = self.error
            last = error if error is not None else self._next_chunk(self.finish_reason)
            self._call_soon(self.chunks.put_nowait, last)
            return
        future, error = self.future, self.error

        def settle() -> None:
            if future is None or future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(self._result())

        self._call_soon(settle)

    def _result(self) -> GenerationResult:
        assert self.finish_reason is not None
        return self._chunk(0, self.finish_reason).result()

    def _next_chunk(self, finish_reason: FinishReason | None) -> GenerationChunk:
        start = self.streamed
        self.streamed = len(self.output_ids)
        return self._chunk(start, finish_reason)

    def _chunk(self, start: int, finish_reason: FinishReason | None) -> GenerationChunk:
        """The tokens from output position ``start`` with what the sampling asked of them."""
        sampling = self.sampling
        kind = logprob_kind(sampling)
        return GenerationChunk(
            self.output_ids[start:],
            self.logprobs[start:],
            finish_reason,
            policy_versions=self.versions[start:],
            logprob_kind=kind,
            raw_logprobs=self.raw_logprobs[start:] if kind != "raw_logprobs" else None,
            kept_mass=self.kept_mass[start:] if cuts(sampling) else None,
            top_ids=self.top_ids[start:] if sampling.top_logprobs else None,
            top_logprobs=self.top_logprobs[start:] if sampling.top_logprobs else None,
            entropy=self.entropy[start:] if sampling.record_entropy else None,
        )

    def _call_soon(self, callback: Callable[..., object], *args: object) -> None:
        # A closed loop means the caller is gone; the worker thread must live on regardless.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, *args)


class BatchRunner:
    """The running batch of ``model``, its prefix cache (``prefix_cache_tokens``; 0: none)
    and the counts the engine reports."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        eos_token_ids: frozenset[int],
        pad_id: int,
        prefix_cache_tokens: int,
    ) -> None:
        _check_full_attention(model)
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.pad_id = pad_id
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.batch: DecodeBatch[Request] | None = None
        #: Prefill passes run (requests arriving together share one).
        self.batches_run = 0
        #: Prompt tokens not recomputed thanks to shared prefixes and the prefix cache.
        self.prefix_tokens_saved = 0

    @torch.inference_mode()
    def admit(self, requests: list[Request], version: int) -> None:
        """Prefill ``requests`` past the prefixes they reuse, sample their first tokens and
        merge them into the running batch. A failure fails these requests only."""
        self.batches_run += 1
        try:
            reuse = self._plan_reuse(requests)
            prompts = [r.prompt for r in requests]
            batch, logits = DecodeBatch.prefill(self.model, requests, prompts, reuse, self.pad_id)
            for row, request in enumerate(requests):
                request.kv_version = version
                self._keep_prompt(batch, row, request)
            batch.next_ids = self._sample(requests, logits, version)
            self.batch = batch if self.batch is None else self.batch.merge(batch)
        except Exception as exc:
            _fail(requests, exc)

    def _keep_prompt(self, batch: DecodeBatch[Request], row: int, request: Request) -> None:
        """Cache a prompt's KV as soon as it is computed: a request admitted while this one
        still runs (its GRPO group's later members, a re-issued turn) reuses it."""
        cache = self.prefix_cache
        if cache.accepts(len(request.prompt)) and not cache.covers(request.prompt):
            cache.insert(batch.row_prefix(row, request.input_ids))

    @torch.inference_mode()
    def step(self, version: int) -> None:
        """One decode step of every running row. A failure fails them all, never the worker."""
        batch = self.batch
        if batch is None:
            return
        try:
            logits = batch.step(self.model)
            batch.next_ids = self._sample(batch.rows, logits, version)
        except Exception as exc:
            self.batch = None
            _fail(batch.rows, exc)

    def retire(self, version: int) -> None:
        """Drop the rows that are done, keeping in the prefix cache the KV of those whose
        every column was computed by the weights of ``version``."""
        if self.batch is None or not any(r.done for r in self.batch.rows):
            return
        keep = []
        for row, request in enumerate(self.batch.rows):
            if not request.done:
                keep.append(row)
                continue
            # A row prefilled before a weight update (kept across it) holds stale KV.
            sequence = request.input_ids + request.output_ids
            fresh = request.kv_version == version and request.error is None
            if fresh and self.prefix_cache.accepts(len(sequence) - 1):
                self.prefix_cache.insert(self.batch.row_prefix(row, sequence))
        self.batch = self.batch.select(keep)

    def _plan_reuse(self, requests: list[Request]) -> list[Reuse]:
        """Each prompt's reusable head: the longest cached prefix, or a longer prefix shared
        with requests admitted with it (a GRPO group's task), computed once here and cached.
        The last prompt token always runs: its logits sample the first token."""
        prompts = [r.prompt for r in requests]
        # In sorted order, a prefix computed for one group serves the next one's shared head.
        order = sorted(range(len(requests)), key=lambda i: requests[i].input_ids)
        shared = _shared_prefix_lengths(prompts, order)
        computed: list[CachedPrefix] = []  # kept here too: the cache may refuse them
        plan: list[Reuse] = [(None, 0)] * len(requests)
        for index in order:
            prompt, limit = prompts[index], len(prompts[index]) - 1
            entry, length = self.prefix_cache.match(prompt)
            for candidate in computed:
                if (reach := common_prefix_length(prompt, candidate.token_ids)) > length:
                    entry, length = candidate, reach
            length = min(length, limit)
            target = min(shared[index], limit)
            if target - length >= MIN_SHARED_PREFIX:
                entry = extend_prefix(self.model, (entry, length), prompt[:target])
                self.prefix_cache.insert(entry)
                computed.append(entry)
                self.prefix_tokens_saved -= target - length
                length = target
            plan[index] = (entry, length)
            self.prefix_tokens_saved += length
        return plan

    def _sample(self, rows: list[Request], logits: torch.Tensor, version: int) -> torch.Tensor:
        """Each row's next token from its logits row; returns the ids each row feeds next."""
        next_ids = torch.full((len(rows),), self.pad_id, dtype=torch.long)
        for row, request in enumerate(rows):
            if request.done:
                continue
            if request.abort_requested:
                request.finish("abort")
                continue
            try:
                sampled = choose_token(logits[row], request.sampling, request.generator)
            except Exception as exc:  # this row's failure, not its neighbours'
                request.error = EngineError(f"sampling failed: {exc}")
                continue
            token = sampled.token
            request.output_ids.append(token)
            request.logprobs.append(sampled.logprob)
            request.raw_logprobs.append(sampled.raw_logprob)
            request.kept_mass.append(sampled.kept_mass)
            if sampled.top_ids is not None and sampled.top_logprobs is not None:
                request.top_ids.append(sampled.top_ids)
                request.top_logprobs.append(sampled.top_logprobs)
            if sampled.entropy is not None:
                request.entropy.append(sampled.entropy)
            # Weights change only while no forward pass runs, so these logits are this version's.
            request.versions.append(version)
            next_ids[row] = token
            reason = self._stop_reason(request, token)
            if reason is not None:
                request.finish(reason)
        return next_ids.to(logits.device)

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        if token in self.eos_token_ids or token in request.sampling.stop_token_ids:
            return "stop"
        if request.sampling.stop and self._ends_in_stop_string(request):
            return "stop"
        if len(request.output_ids) >= request.max_new_tokens:
            return "length"
        return None

    def _ends_in_stop_string(self, request: Request) -> bool:
        """Whether the newest token completed a stop string, in whole characters: the first
        token of an emoji decodes to U+FFFD, which the answer does not contain."""
        if request.text is None:
            request.text = WholeText(self._decode)
            for token in request.output_ids[:-1]:
                request.text.push(token)
        added = request.text.push(request.output_ids[-1])
        if not added:
            return False
        stops = request.sampling.stop
        tail = request.text.text[-(len(added) + max(map(len, stops)) - 1) :]
        return any(s in tail for s in stops)

    def _decode(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text


def _check_full_attention(model: Any) -> None:
    """Refuse a model with other than full attention: its masked columns (padding, the gaps of
    reused prefixes) would count in a sliding window, say."""
    config = model.config.get_text_config(decoder=True)
    kinds = set(get_layer_types_and_kwargs(config)[0])
    if kinds != {"full_attention"}:
        raise ConfigError(
            f"the embedded engine runs full-attention models only, not {sorted(kinds)} layers",
            "model",
        )


def _fail(requests: list[Request], exc: Exception) -> None:
    error = EngineError(f"embedded engine failed: {exc!r}")
    for request in requests:
        if not request.done:
            request.error = error


def _shared_prefix_lengths(prompts: list[torch.Tensor], order: list[int]) -> list[int]:
    """For each prompt, the longest prefix it shares with another; ``order`` sorts the prompts,
    so that prefix is shared with a neighbour in it."""
    shared = [0] * len(prompts)
    for a, b in itertools.pairwise(order):
        length = common_prefix_length(prompts[a], prompts[b])
        shared[a], shared[b] = max(shared[a], length), max(shared[b], length)
    return shared
