"""The embedded engine: a real small model run in-process with PyTorch + transformers.

One worker thread batches continuously: between two forward passes it answers the rows that
finished (their slots free at once) and prefills waiting requests into free slots, then merges
them into the running batch (``DecodeBatch``), so a request never waits for others to finish.
Every row samples under its own params and generator; a row whose sampling fails (NaN logits)
fails its own request only. Logprobs are the log-softmax of the fp32 logits at temperature 1
for each sampled token, whatever the sampling temperature.

A prompt's KV is reused where it was computed before: each prompt's KV, once prefilled, and
each finished row's KV go to a prefix cache keyed by token ids (``PrefixCache``), so turn k's
prompt and completion serve turn k+1 and a GRPO group's later members reuse the first one's
prompt; a prefix that requests admitted together share is computed once.

``generate_stream`` runs the same request and hands out its tokens as the batch samples them:
between two forward passes the worker puts each streamed row's new tokens on its caller's loop,
and a caller that lags gets what piled up as one chunk. Closing the stream early aborts the
request and waits until its slot is free.

Weights are replaced in place (``WeightSync``): ``pause`` stops the worker from admitting
requests (``abort`` ends the running rows at the next step, ``drain`` lets them finish,
``keep`` freezes them between two decode steps with their KV cache, as SGLang's in-place pause
does); the new tensors are copied into the existing parameters only while no forward pass
runs, the prefix cache is cleared with them, and each sampled token carries the version of the
weights whose forward pass produced it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rollway.checks import check_count
from rollway.engines.base import PauseMode, WeightSource
from rollway.engines.embedded.batch_runner import BatchRunner, Request
from rollway.engines.embedded.kv_cache import PrefixCache
from rollway.engines.embedded.sampling import make_generator
from rollway.engines.embedded.state_dicts import (
    check_state_dict,
    copy_weights,
    read_state_dict,
    weight_files,
    weight_names,
)
from rollway.errors import ConfigError, EngineError, InvalidFieldsError
from rollway.generation import GenerationChunk, GenerationResult, SamplingParams
from rollway.model_folders import resolve_model_path

#: What a streamed request's queue carries: chunks, or the error that ended it.
_ChunkQueue = asyncio.Queue[GenerationChunk | BaseException]

#: The prefix cache's default budget: about 380 MB of KV for SmolLM2-135M in fp32.
DEFAULT_PREFIX_CACHE_TOKENS = 8192


class EmbeddedEngine:
    """A causal LM from a local HF folder (default: SmolLM2-135M-Instruct), batched, whose
    weights a training loop may replace (``WeightSync``). ``max_batch_size`` rows decode at
    once; the prefix cache holds up to ``prefix_cache_tokens`` tokens of KV (0: none)."""

    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    model_name: str | None = None
    tokenizer: Any
    context_length: int

    pause_modes: frozenset[PauseMode] = frozenset({"abort", "drain", "keep"})

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: torch.device,
        max_batch_size: int = 32,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        context_length: int | None = None,
    ) -> None:
        check_count("prefix_cache_tokens", prefix_cache_tokens, least=0)
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.context_length = _context_length(model, context_length)
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        #: The version of the weights sampling now; changed only while no forward pass runs.
        self.policy_version = 0
        # One condition guards the state below; the worker never holds it during a forward pass.
        self._cond = threading.Condition()
        self._active: dict[str, Request] = {}
        self._pending: deque[Request] = deque()
        #: Admitted and not yet answered; the worker alone runs ``_runner``, their tensors.
        self._running: list[Request] = []
        self._runner = BatchRunner(
            model,
            tokenizer,
            eos_token_ids=self.eos_token_ids,
            pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            prefix_cache_tokens=prefix_cache_tokens,
        )
        #: True while the worker may run a forward pass (rows run or join, none frozen).
        self._decoding = False
        self._paused: PauseMode | None = None
        #: True while new weights are copied in: no row joins, no frozen row goes on.
        self._loading = False
        self._closing = False
        #: Requests aborted so far.
        self.aborted_total = 0
        self._worker = threading.Thread(target=self._work, name="rollway-embedded", daemon=True)
        self._worker.start()

    @property
    def prefix_cache(self) -> PrefixCache:
        return self._runner.prefix_cache

    @property
    def batches_run(self) -> int:
        """Prefill passes run so far (requests arriving together share one)."""
        return self._runner.batches_run

    @property
    def prefix_tokens_saved(self) -> int:
        """Prompt tokens not recomputed thanks to shared prefixes and the prefix cache."""
        return self._runner.prefix_tokens_saved

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path | None = None,
        *,
        device: str | None = None,
        max_batch_size: int = 32,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        dtype: str = "float32",
        context_length: int | None = None,
    ) -> EmbeddedEngine:
        """``dtype`` is the weights' (and the KV cache's): float32, the default, or bfloat16
        (about 1.5x the decode speed on a CPU with AVX-512 BF16, half the memory; what GPUs
        run); float16 on a GPU only. Logprobs are always taken from the logits in float32, and
        weights pushed in another float dtype are cast to this one. ``context_length`` caps
        the context below the model's (vLLM's ``--max-model-len``): prompt and answer fit in it."""
        check_count("prefix_cache_tokens", prefix_cache_tokens, least=0)  # before the slow load
        if context_length is not None:
            check_count("context_length", context_length, least=2)
        torch_dtype = parse_dtype(dtype)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        path = resolve_model_path(None if model is None else str(model))
        torch_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if torch_dtype == torch.float16 and torch_device.type == "cpu":
            raise ConfigError("dtype float16 needs a GPU; on a CPU use bfloat16", "dtype")
        require_weights(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        # transformers wraps ``to`` with functools.wraps, whose type takes the model as argument 1.
        lm.to(torch_device).eval()  # type: ignore[arg-type]
        return cls(
            lm,
            tokenizer,
            device=torch_device,
            max_batch_size=max_batch_size,
            prefix_cache_tokens=prefix_cache_tokens,
            context_length=context_length,
        )

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        request = self._submit(input_ids, sampling, request_id, None)
        assert request.future is not None
        try:
            return await request.future
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]:
        chunks: _ChunkQueue = asyncio.Queue()
        request = self._submit(input_ids, sampling, request_id, chunks)
        finished = False
        try:
            while not finished:
                chunk = _join_waiting(await chunks.get(), chunks)
                finished = chunk.finish_reason is not None
                yield chunk
        finally:
            if not request.settled:  # closed early or cancelled: its slot frees at once
                await self.abort(request_id)
                await _until_answered(chunks)

    def _submit(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        chunks: _ChunkQueue | None,
    ) -> Request:
        """Check a request and queue it; answered through ``chunks`` when given, else its
        future."""
        self._check_input(input_ids)  # the sampling checked itself (SamplingParams)
        room = self.context_length - len(input_ids)
        max_new = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        loop = asyncio.get_running_loop()
        request = Request(
            request_id=request_id,
            input_ids=list(input_ids),
            sampling=sampling,
            max_new_tokens=max(max_new, 0),
            loop=loop,
            future=None if chunks is not None else loop.create_future(),
            generator=make_generator(sampling.seed, self.device),
            chunks=chunks,
        )
        with self._cond:
            if self._closing:
                raise EngineError("the embedded engine is closed")
            if request_id in self._active:
                raise InvalidFieldsError(f"request id {request_id!r} is already in flight")
            self._active[request_id] = request
            self._pending.append(request)
            self._cond.notify_all()
        return request

    async def abort(self, request_id: str) -> None:
        with self._cond:
            request = self._active.get(request_id)
            if request is None:
                return
            if request in self._pending:  # never started: answer now, even while paused
                self._pending.remove(request)
                request.finish("abort")
                self._settle(request)
            else:
                request.abort_requested = True
                self._cond.notify_all()  # a frozen batch answers it at once

    async def pause(self, mode: PauseMode = "abort") -> None:
        if mode not in self.pause_modes:
            raise ConfigError(f"pause mode {mode!r} is not one of {sorted(self.pause_modes)}")
        with self._cond:
            self._paused = mode
            if mode == "abort":
                for request in self._running:
                    request.abort_requested = True
            self._cond.notify_all()
        await asyncio.to_thread(self._wait_until, lambda: not self._decoding)

    async def resume(self) -> None:
        with self._cond:
            self._paused = None
            self._cond.notify_all()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        self._check_version(version)
        # Read and check before pausing: the pause lasts only as long as the copy.
        state = await asyncio.to_thread(self._read_checked, source)
        with self._cond:
            paused = self._paused is not None
        if not paused:
            await self.pause("drain")
        try:
            await asyncio.to_thread(self._swap_weights, state, version)
        finally:
            if not paused:
                await self.resume()

    async def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        await asyncio.to_thread(self._worker.join)

    def _check_version(self, version: int) -> None:
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )

    def _read_checked(self, source: WeightSource) -> dict[str, torch.Tensor]:
        return check_state_dict(self.model, read_state_dict(source))

    def _swap_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._decoding and not self._loading)
            self._check_version(version)  # a concurrent update may have gone first
            self._loading = True
        copied = False
        try:
            copy_weights(self.model, state)
            copied = True
        finally:
            with self._cond:
                self._loading = False
                if copied:
                    self.policy_version = version
                # Even a failed copy may have changed weights: no old KV serves what follows.
                self.prefix_cache.clear()
                self._cond.notify_all()

    def _wait_until(self, predicate: Callable[[], bool]) -> None:
        with self._cond:
            self._cond.wait_for(predicate)

    def _check_input(self, input_ids: list[int]) -> None:
        if not input_ids:
            raise InvalidFieldsError("input_ids is empty", param="input_ids")
        if len(input_ids) >= self.context_length:
            raise InvalidFieldsError(
                f"{len(input_ids)} input ids leave no room in the context of "
                f"{self.context_length} tokens",
                param="input_ids",
            )
        bad = next((t for t in input_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidFieldsError(f"token id {bad} is outside the vocabulary", "input_ids")

    def _work(self) -> None:
        while (admitted := self._next_step()) is not None:
            # No weight update runs until the next ``_next_step``: this version is the model's.
            version = self.policy_version
            # Finished rows leave the batch, their KV to the prefix cache, off the lock: those
            # answered between passes (aborted) first, then those this pass finished, before
            # they are answered (a conversation's next turn finds its previous one's KV).
            self._runner.retire(version)
            if admitted:
                self._runner.admit(admitted, version)
            else:
                self._runner.step(version)
            self._runner.retire(version)

    def _next_step(self) -> list[Request] | None:
        """Between two forward passes: answer finished rows, freeze while paused with ``keep``
        or loading, admit waiting requests into free slots. Returns the requests to prefill
        (empty: run a decode step, if rows run), or None once closed."""
        with self._cond:
            while True:
                self._retire_finished()
                frozen = self._paused == "keep" or self._loading
                if self._closing:
                    if not self._running:  # answer what waits, then stop
                        while self._pending:
                            request = self._pending.popleft()
                            request.finish("abort")
                            self._settle(request)
                        self._decoding = False
                        self._cond.notify_all()
                        return None
                    if frozen:  # frozen rows would never go on
                        for request in self._running:
                            request.abort_requested = True
                        continue
                if not frozen:
                    open_gate = self._paused is None and not self._closing
                    admitted = self._take_pending() if open_gate else []
                    # Answered rows still in the batch: the worker drops them, then waits.
                    if admitted or self._running or self._runner.batch is not None:
                        self._decoding = True
                        return admitted
                self._decoding = False
                self._cond.notify_all()
                self._cond.wait()

    def _take_pending(self) -> list[Request]:
        """Move waiting requests into the free slots (call with the condition held)."""
        admitted: list[Request] = []
        while self._pending and len(self._running) + len(admitted) < self.max_batch_size:
            request = self._pending.popleft()
            if request.max_new_tokens == 0:
                request.finish("length")
                self._settle(request)
            else:
                admitted.append(request)
        self._running.extend(admitted)
        return admitted

    def _retire_finished(self) -> None:
        """Answer finished and aborted rows: their slots free at once (call with the
        condition held; the worker drops their KV columns before its next forward pass).
        Streamed rows that go on get their new tokens."""
        for request in self._running:
            if request.abort_requested and not request.done:
                request.finish("abort")
        for request in self._running:
            if request.done:
                self._settle(request)
            else:
                request.publish()
        self._running = [r for r in self._running if not r.done]

    def _settle(self, request: Request) -> None:
        """Answer ``request`` once (call with the condition held)."""
        if request.settled:
            return
        request.settled = True
        self.aborted_total += request.finish_reason == "abort"
        if self._active.get(request.request_id) is request:
            del self._active[request.request_id]
        request.resolve()


def _join_waiting(first: GenerationChunk | BaseException, chunks: _ChunkQueue) -> GenerationChunk:
    """``first`` and the chunks already waiting behind it, as one chunk (a caller that lags
    gets what piled up at once); an error that ended the request is raised."""
    parts: list[GenerationChunk] = []
    item = first
    while True:
        if isinstance(item, BaseException):
            raise item
        parts.append(item)
        if item.finish_reason is not None or chunks.empty():
            break
        item = chunks.get_nowait()
    return parts[0] if len(parts) == 1 else GenerationChunk.join(parts)


async def _until_answered(chunks: _ChunkQueue) -> None:
    """Until the worker has answered the request (its last chunk, or its error, arrived)."""
    while True:
        item = await chunks.get()
        if isinstance(item, BaseException) or item.finish_reason is not None:
            return


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


#: The weight dtypes the embedded engine runs, by the names a spec uses.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name``; a ``ConfigError`` naming the choices otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype {name!r} is not one of {', '.join(DTYPES)}", "dtype") from None


def _context_length(model: Any, cap: int | None) -> int:
    """The model's context (``max_position_embeddings``), or ``cap`` where it is smaller: past
    the model's positions the model has no answer, so a larger cap is an error."""
    own = int(getattr(model.config, "max_position_embeddings", 2048))
    if cap is None:
        return own
    if cap > own:
        raise ConfigError(
            f"context_length {cap} is past the model's context ({own} tokens)", "context_length"
        )
    return cap


def require_weights(folder: Path) -> None:
    """A folder with a tokenizer and a config but no weights (a family's tokenizer, to try
    its template) cannot be run: say so, and what runs without weights."""
    if folder.is_dir() and not weight_files(folder):
        raise ConfigError(
            f"model folder {str(folder)!r} has no weights (no {weight_names()}): the embedded "
            "engine runs a model's weights. To try a family without them, give its folder "
            "to the scripted engine (--engine scripted://FILE --model FOLDER: the answers "
            "listed in FILE) or to the simulator (--engine sim --model FOLDER)",
            param="model",
        )
