"""The embedded engine: a real small model run in-process with PyTorch + transformers.

Requests queue for one worker thread. Requests that arrive while a batch decodes join the next
batch. A batch computes its prompts' shared prefix once, left-pads the rest with explicit
position ids and decodes step by step with a KV cache, every row sampling under its own params
and generator. A row whose sampling fails (NaN logits) fails its own request only; the batch
decodes on. Logprobs are the log-softmax of
the fp32 logits at temperature 1 for each sampled token, whatever the sampling temperature.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollway.engines.models import resolve_model_path
from rollway.engines.sampling import check_sampling, choose_token, make_generator
from rollway.errors import EngineError, InvalidFieldsError
from rollway.types import FinishReason, GenerationResult, SamplingParams

#: Shorter shared prefixes are not worth a separate forward pass.
_MIN_SHARED_PREFIX = 16


@dataclass(eq=False)
class _Request:
    request_id: str
    input_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[GenerationResult]
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    #: Set when this row alone failed; its batch goes on without it.
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def finish(self, reason: FinishReason) -> None:
        self.finish_reason = reason

    def resolve(self, batch_error: BaseException | None = None) -> None:
        error = batch_error or self.error

        def settle() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                result = GenerationResult(self.output_ids, self.logprobs, self.finish_reason)
                self.future.set_result(result)

        # A closed loop means the caller is gone; the worker thread must live on regardless.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle)


class EmbeddedEngine:
    """A causal LM from a local HF folder (default: SmolLM2-135M-Instruct), batched."""

    def __init__(
        self, model: Any, tokenizer: Any, *, device: torch.device, max_batch_size: int = 32
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._active: dict[str, _Request] = {}
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        #: Batches decoded and requests aborted so far (concurrent requests share batches).
        self.batches_run = 0
        self.aborted_total = 0
        #: Prompt tokens not recomputed thanks to shared prefixes.
        self.prefix_tokens_saved = 0
        self._worker = threading.Thread(target=self._work, name="rollway-embedded", daemon=True)
        self._worker.start()

    @classmethod
    def from_pretrained(
        cls, model: str | Path | None = None, *, device: str | None = None, max_batch_size: int = 32
    ) -> EmbeddedEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        path = resolve_model_path(None if model is None else str(model))
        torch_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        lm.to(torch_device).eval()
        return cls(lm, tokenizer, device=torch_device, max_batch_size=max_batch_size)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self._check_input(input_ids)
        check_sampling(sampling)
        room = self.context_length - len(input_ids)
        max_new = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        loop = asyncio.get_running_loop()
        request = _Request(
            request_id=request_id,
            input_ids=list(input_ids),
            sampling=sampling,
            max_new_tokens=max(max_new, 0),
            loop=loop,
            future=loop.create_future(),
            generator=make_generator(sampling.seed, self.device),
        )
        with self._lock:
            if request_id in self._active:
                raise InvalidFieldsError(f"request id {request_id!r} is already in flight")
            self._active[request_id] = request
        self._queue.put(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise

    async def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._active:
                self._aborted.add(request_id)

    async def close(self) -> None:
        self._queue.put(None)
        await asyncio.to_thread(self._worker.join)

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
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = [first], False
            while len(batch) < self.max_batch_size and not self._queue.empty():
                more = self._queue.get()
                if more is None:
                    stop = True
                    break
                batch.append(more)
            self._run(batch)
            if stop:
                return

    def _run(self, batch: list[_Request]) -> None:
        error: BaseException | None = None
        self.batches_run += 1
        try:
            self._decode(batch)
        except Exception as exc:  # one bad batch fails its requests, never the worker
            error = EngineError(f"embedded engine failed: {exc!r}")
        for request in batch:
            self.aborted_total += request.finish_reason == "abort"
            with self._lock:
                self._active.pop(request.request_id, None)
                self._aborted.discard(request.request_id)
            request.resolve(error)

    def _is_aborted(self, request: _Request) -> bool:
        return request.request_id in self._aborted

    @torch.inference_mode()
    def _decode(self, batch: list[_Request]) -> None:
        for request in batch:
            if self._is_aborted(request):
                request.finish("abort")
            elif request.max_new_tokens == 0:
                request.finish("length")
        live = [r for r in batch if r.finish_reason is None]
        if not live:
            return
        out, attention_mask, positions = self._prefill(live)
        while True:
            logits = out.logits[:, -1, :].float()
            next_ids = self._sample_step(live, logits)
            if all(r.done for r in live):
                return
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(live), 1)], 1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=next_ids[:, None],
                attention_mask=attention_mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
                logits_to_keep=1,
            )

    def _prefill(self, live: list[_Request]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run the prompts; return the output, attention mask and position ids so far.

        Rows usually share a long prefix (system prompt, tools, few-shot examples, a group's
        task). That prefix is computed once and its KV cache repeated for every row; each row's
        own suffix follows, left-padded, so padding sits between prefix and suffix (masked,
        with explicit positions).
        """
        shared = _common_prefix_length([r.input_ids for r in live])
        shared = min(shared, min(len(r.input_ids) for r in live) - 1)
        cache = None
        if len(live) > 1 and shared >= _MIN_SHARED_PREFIX:
            prefix = torch.tensor([live[0].input_ids[:shared]], device=self.device)
            cache = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
            cache.batch_repeat_interleave(len(live))
            self.prefix_tokens_saved += shared * (len(live) - 1)
        else:
            shared = 0
        ids, mask = self._left_pad([r.input_ids[shared:] for r in live])
        positions = shared + (mask.cumsum(-1) - 1).clamp(min=0)
        prefix_mask = mask.new_ones(len(live), shared)
        attention_mask = torch.cat([prefix_mask, mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out, attention_mask, positions

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[index, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _sample_step(self, live: list[_Request], logits: torch.Tensor) -> torch.Tensor:
        logprobs = torch.log_softmax(logits, dim=-1)
        next_ids = torch.full((len(live),), self._pad_id, dtype=torch.long)
        for row, request in enumerate(live):
            if request.done:
                continue
            if self._is_aborted(request):
                request.finish("abort")
                continue
            try:
                token = choose_token(logits[row], request.sampling, request.generator)
            except Exception as exc:  # this row's failure, not its neighbours'
                request.error = EngineError(f"sampling failed: {exc}")
                continue
            request.output_ids.append(token)
            request.logprobs.append(float(logprobs[row, token].item()))
            next_ids[row] = token
            reason = self._stop_reason(request, token)
            if reason is not None:
                request.finish(reason)
        return next_ids.to(self.device)

    def _stop_reason(self, request: _Request, token: int) -> FinishReason | None:
        if token in self.eos_token_ids or token in request.sampling.stop_token_ids:
            return "stop"
        if request.sampling.stop and self._ends_in_stop_string(request):
            return "stop"
        if len(request.output_ids) >= request.max_new_tokens:
            return "length"
        return None

    def _ends_in_stop_string(self, request: _Request) -> bool:
        # Each token decodes to at least one character, so this window holds any stop string
        # that the newest token completed.
        window = max(len(s) for s in request.sampling.stop) + 2
        tail = self.tokenizer.decode(request.output_ids[-window:], skip_special_tokens=False)
        return any(s in tail for s in request.sampling.stop)


def _common_prefix_length(rows: list[list[int]]) -> int:
    first = rows[0]
    length = len(first)
    for row in rows[1:]:
        length = min(length, len(row))
        for i in range(length):
            if row[i] != first[i]:
                length = i
                break
    return length


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
