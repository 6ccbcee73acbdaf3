"""The front port of ``rollway gateway --workers N``: each request goes to the worker that
holds its rollout (or experiment), by ``WorkerPool.route``; weights, pauses, metrics and
health are answered for all of them (``fan_out``). A registration answers a base URL on the
worker's own port, so a rollout's turns skip the front; calls sent to the front anyway are
passed on.

The front remembers, for each rollout, the incarnation of the worker that registered it. Once
that worker has died, every call for the rollout is answered 503 as an
``InfrastructureError`` saying it was lost (the client reruns it as an infrastructure failure),
never sent on to the worker started in its place, which would not know it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollway.errors import InfrastructureError, UnknownRolloutError
from rollway.gateway.metrics import PROMETHEUS_TEXT
from rollway.gateway.request_schema import WeightUpdateRequest
from rollway.gateway.weight_control import NewWeights
from rollway.gateway.workers.fan_out import WorkerWeights, merge_metrics
from rollway.gateway.workers.proxy import (
    call_json,
    error_response,
    forward,
    forward_or_raise,
    read_capped,
)
from rollway.gateway.workers.worker_pool import Worker, WorkerPool
from rollway.validation import parse_model
from rollway.web.handlers import (
    JSONResponse,
    bearer,
    guarded,
    read_json,
    require_key,
    session_id,
)

#: How long a request for a worker being started again waits for it (then a 503).
STARTING_WAIT_S = 30.0
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_SHARED_PATHS = (
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/models",
)


class HeldRollouts:
    """Rollout id -> (incarnation of its worker at registration, last use), and each one's key
    (a shared-route call finds its rollout by it). Entries go at unregister, or after
    ``ttl_s`` unused (the worker drops the rollout then too)."""

    def __init__(self, ttl_s: float | None) -> None:
        self.ttl_s = ttl_s
        self._held: dict[str, tuple[int, float]] = {}
        self._by_key: dict[str, str] = {}
        self._keys: dict[str, str] = {}

    def registered(self, rollout_id: str, incarnation: int, api_key: str) -> None:
        self._held[rollout_id] = (incarnation, time.monotonic())
        self._by_key[api_key], self._keys[rollout_id] = rollout_id, api_key

    def rollout_of_key(self, api_key: str | None) -> str | None:
        return self._by_key.get(api_key) if api_key else None

    def lost_by(self, rollout_id: str, worker: Worker) -> bool:
        """Whether the rollout was registered on an earlier life of ``worker``."""
        held = self._held.get(rollout_id)
        if held is None:
            return False
        self._held[rollout_id] = (held[0], time.monotonic())
        return held[0] != worker.incarnation

    def drop(self, rollout_id: str) -> None:
        self._held.pop(rollout_id, None)
        self._by_key.pop(self._keys.pop(rollout_id, ""), None)

    def __len__(self) -> int:
        return len(self._held)

    async def expire_forever(self) -> None:
        if self.ttl_s is None:
            return
        while True:
            await asyncio.sleep(min(max(self.ttl_s / 4, 0.01), 30.0))
            oldest = time.monotonic() - self.ttl_s
            for rollout_id in [r for r, (_, used) in self._held.items() if used < oldest]:
                self.drop(rollout_id)


def _front(request: Request) -> tuple[WorkerPool, HeldRollouts, WorkerWeights]:
    state = request.app.state
    return state.pool, state.held, state.weights


async def rollout_call(request: Request) -> Response:
    pool, held, _ = _front(request)
    rollout_id = request.path_params["rollout_id"]
    action = request.path_params["rest"]
    worker = pool.route(rollout_id)
    body = await read_capped(request)
    if held.lost_by(rollout_id, worker):
        if action == "unregister":  # what the client does last: it is gone, as asked
            held.drop(rollout_id)
            return error_response(UnknownRolloutError(_lost(rollout_id, worker)))
        return error_response(InfrastructureError(_lost(rollout_id, worker)))
    if action == "register":  # a new rollout: one the worker lost by dying is made again
        return await _register(held, worker, request, body)
    if not await _started(worker):
        return error_response(InfrastructureError(f"gateway worker {worker.index} is starting"))
    answer = await forward(worker, request, body)
    if action == "unregister" and answer.status_code in (200, 404):
        held.drop(rollout_id)
    return answer


async def _register(held: HeldRollouts, worker: Worker, request: Request, body: bytes) -> Response:
    answer, incarnation = await _forward_through_restart(worker, request, body)
    if answer.status_code == 200:
        registration = orjson.loads(answer.body)
        held.registered(request.path_params["rollout_id"], incarnation, registration["api_key"])
        return _straight_to(worker, request, registration)
    return answer


def _straight_to(worker: Worker, request: Request, registration: dict[str, Any]) -> Response:
    """The registration's answer, its base URL the worker's own port on the host the caller
    reached the front by: the rollout's turns go straight there, not through the front."""
    host = request.url.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    rollout_id = registration["rollout_id"]
    registration["base_url"] = f"http://{host}:{worker.port}/v1/rollouts/{rollout_id}"
    registration["worker"] = worker.index
    return JSONResponse(registration)


def _lost(rollout_id: str, worker: Worker) -> str:
    return (
        f"rollout {rollout_id!r} was lost: gateway worker {worker.index}, which held it, died "
        "and was started again without it; run the rollout again"
    )


async def _started(worker: Worker) -> bool:
    """Whether the worker serves, waiting out a restart up to ``STARTING_WAIT_S``."""
    if worker.up:
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(STARTING_WAIT_S):
            await worker.ready.wait()
    return worker.up


async def shared_call(request: Request) -> Response:
    """A call on the shared routes goes to the worker of the rollout its key (or its
    ``X-Session-ID``) names; one that names none is refused there, as one gateway does."""
    pool, held, _ = _front(request)
    rollout_id = held.rollout_of_key(bearer(request)) or session_id(request)
    worker = pool.route(rollout_id) if rollout_id else pool.workers[0]
    body = await read_capped(request)
    if not await _started(worker):
        return error_response(InfrastructureError(f"gateway worker {worker.index} is starting"))
    return await forward(worker, request, body)


async def keyed_call(request: Request) -> Response:
    """An experiment's lease lives on one worker, chosen like a rollout's; taking and giving
    it back may be asked again, so a worker that died holding it is waited for."""
    pool, _, _ = _front(request)
    worker = pool.route(request.path_params["exp_id"])
    answer, _ = await _forward_through_restart(worker, request, await read_capped(request))
    return answer


async def _forward_through_restart(
    worker: Worker, request: Request, body: bytes
) -> tuple[Response, int]:
    """A call that may be sent again: to a worker being started again once it is up, and
    once more to its next life when it died meanwhile (killed, its death not yet seen: the
    connection is refused while the front still counts it up); else a 503 after
    ``STARTING_WAIT_S``, as for any call that meets a restart. With the life it reached."""
    if not await _started(worker):
        error = InfrastructureError(f"gateway worker {worker.index} is starting")
        return error_response(error), worker.incarnation
    incarnation, died = worker.incarnation, worker.died
    try:
        return await forward_or_raise(worker, request, body), incarnation
    except InfrastructureError as exc:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STARTING_WAIT_S):
                await died.wait()  # the pool's watcher sees a death within milliseconds
                await worker.ready.wait()
        if not worker.up:
            return error_response(exc), incarnation
    return await forward(worker, request, body), worker.incarnation


async def first_worker(request: Request) -> Response:
    """What is the same on every worker (the policy, the API document, a 404)."""
    pool, _, _ = _front(request)
    worker = next((w for w in pool.workers if w.up), pool.workers[0])
    return await forward(worker, request, await read_capped(request))


async def update_weights(request: Request) -> Response:
    _require_admin(request)
    _, _, weights = _front(request)
    body = parse_model(WeightUpdateRequest, await read_json(request))
    update = await weights.update(NewWeights(body.source, body.version, body.mode, body.loaded))
    return JSONResponse(update.to_dict())


async def pause(request: Request) -> Response:
    _require_admin(request)
    _, _, weights = _front(request)
    return JSONResponse(await weights.pause(await read_json(request)))


async def resume(request: Request) -> Response:
    _require_admin(request)
    _, _, weights = _front(request)
    return JSONResponse(await weights.resume())


async def metrics(request: Request) -> Response:
    _require_admin(request)
    pool, _, _ = _front(request)
    texts = await asyncio.gather(*(_metrics_of(w, request) for w in pool.workers if w.up))
    return Response(merge_metrics(list(texts)), media_type=PROMETHEUS_TEXT)


async def _metrics_of(worker: Worker, request: Request) -> str:
    async with worker.session.get(
        f"{worker.url}/metrics", headers={"Authorization": f"Bearer {request.app.state.admin_key}"}
    ) as answer:
        return await answer.text()


async def health(request: Request) -> Response:
    """200 while the front serves; ``workers`` says which are up, ``engine`` is ``down`` when
    an up worker says its engine is."""
    pool, held, _ = _front(request)
    answers = await asyncio.gather(*(_health_of(w) for w in pool.workers if w.up))
    engine = "down" if any(a.get("engine") == "down" for a in answers) else "up"
    model = next((a.get("model") for a in answers if a.get("model")), None)
    body = {
        "status": "ok",
        "model": model,
        "engine": engine,
        "workers": [worker.describe() for worker in pool.workers],
        "rollouts": len(held),
    }
    return JSONResponse(body)


async def _health_of(worker: Worker) -> dict[str, object]:
    try:
        status, answer = await call_json(worker, "GET", "/health", "")
    except InfrastructureError:
        return {}
    return answer if status == 200 and isinstance(answer, dict) else {}


def _require_admin(request: Request) -> None:
    require_key(request, request.app.state.admin_key, "this route needs the gateway's admin key")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool: WorkerPool = app.state.pool
    await pool.start()
    expiry = asyncio.create_task(app.state.held.expire_forever())
    try:
        yield
    finally:
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        await pool.stop()


def create_front_app(pool: WorkerPool, *, admin_key: str, rollout_ttl_s: float | None) -> Starlette:
    """The front over ``pool``; the workers start with the app (its lifespan) and end with it."""
    routes = [
        Route("/health", guarded(health), methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
        Route("/admin/weights", guarded(update_weights), methods=["POST"]),
        Route("/admin/pause", guarded(pause), methods=["POST"]),
        Route("/admin/resume", guarded(resume), methods=["POST"]),
        Route("/v1/rollouts/{rollout_id}/{rest:path}", guarded(rollout_call), methods=_ALL_METHODS),
        Route("/v1/experiments/{exp_id}/{rest:path}", guarded(keyed_call), methods=_ALL_METHODS),
        *(Route(path, guarded(shared_call), methods=["GET", "POST"]) for path in _SHARED_PATHS),
        Route("/{path:path}", guarded(first_worker), methods=_ALL_METHODS),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.pool, app.state.admin_key = pool, admin_key
    app.state.held = HeldRollouts(rollout_ttl_s)
    app.state.weights = WorkerWeights(pool, admin_key)
    return app
