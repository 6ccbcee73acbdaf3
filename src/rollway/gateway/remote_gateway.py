"""A gateway served elsewhere (``rollway gateway``), used over HTTP.

``HttpChat`` is one rollout's chat through the gateway's chat-completions route (what agent
servers use); ``RemoteGateway`` drives the admin routes (register, trajectory, cancel,
unregister) so a client, or many clients and Ray workers, can share one long-lived gateway, and
a client that restarts finds its rollouts still recorded there. The gateway's errors come back
as the same rollway errors the in-process gateway raises."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import aiohttp
import httpx
import orjson

from rollway.engines.base import PauseMode
from rollway.errors import ConfigError, InfrastructureError
from rollway.gateway.chat_answer import Registration
from rollway.gateway.request_schema import RegisterRequest
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate, served_body
from rollway.generation import ChatResult
from rollway.leases import LeaseHolder
from rollway.trajectory import Trajectory
from rollway.web.http_client import HEALTH_TIMEOUT_S, new_session, request_json


def _asking_for_ids(request: dict[str, Any]) -> dict[str, Any]:
    """The request, asking the gateway to send back what it sampled (unless the caller said)."""
    return {"return_token_ids": True, **request}


def _chat_result(body: dict[str, Any]) -> ChatResult:
    """The gateway's chat-completions answer, asked with ``return_token_ids``, read back into
    the ``ChatResult`` the in-process gateway gives (see ``chat_bodies``)."""
    choice, usage = body["choices"][0], body.get("usage") or {}
    sampled = body.get("rollway") or {}
    return ChatResult(
        message=choice["message"],
        finish_reason=choice["finish_reason"],
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        completion_ids=choice.get("token_ids"),
        logprobs=sampled.get("logprobs"),
        turn_index=sampled.get("turn_index"),
    )


class HttpChat:
    """One rollout's ``chat`` over HTTP, with the rollout's own key."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, api_key: str, model_name: str
    ) -> None:
        self.session, self.api_key, self.model_name = session, api_key, model_name
        self.url = f"{base_url.rstrip('/')}/chat/completions"

    async def chat(self, rollout_id: str, request: dict[str, Any]) -> ChatResult:
        body = _asking_for_ids(request)
        return _chat_result(await request_json(self.session, "POST", self.url, self.api_key, body))


class RemoteGateway:
    """Checks the address and admin key at construction (a clear error, before any rollout)."""

    def __init__(self, url: str, *, admin_key: str) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key
        self.model_name = _check(self.url, admin_key)
        self.socket_path: str | None = None
        self._keys: dict[str, str] = {}
        #: Base URLs registrations answered on a worker's own port (``rollway gateway
        #: --workers``); the admin routes stay under ``url``.
        self._base_urls: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None
        #: The lease holder id of the client using it (``rollway.leases``): sent with every
        #: registration, and shipped to Ray workers with the rest.
        self.lease_holder: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to Ray workers: the address and key, not this process's connections.
        return {**self.__dict__, "_keys": {}, "_base_urls": {}, "_session": None}

    def base_url(self, rollout_id: str) -> str:
        """Where the rollout's agent calls: what its registration answered (the gateway
        chooses), else under the gateway's URL."""
        return self._base_urls.get(rollout_id) or f"{self.url}/v1/rollouts/{rollout_id}"

    def _admin_url(self, rollout_id: str) -> str:
        return f"{self.url}/v1/rollouts/{rollout_id}"

    async def register(
        self, rollout_id: str, params: RegisterRequest, *, reuse: bool = False
    ) -> Registration:
        query = {"reuse": "true"} if reuse else {}
        if self.lease_holder is not None:
            query["client"] = self.lease_holder
        url = f"{self._admin_url(rollout_id)}/register"
        if query:
            url += f"?{urlencode(query)}"
        body = params.model_dump(mode="json", exclude_unset=True)
        answer = await self._admin("POST", url, body)
        self._keys[rollout_id] = answer["api_key"]
        if "worker" in answer:  # --workers: the turns go straight to the rollout's worker
            self._base_urls[rollout_id] = str(answer["base_url"])
        return Registration(rollout_id, answer["api_key"])

    async def chat(self, rollout_id: str, request: dict[str, Any]) -> ChatResult:
        key = self._keys.get(rollout_id)
        if key is None:
            raise InfrastructureError(f"rollout {rollout_id!r} was not registered here")
        url = f"{self.base_url(rollout_id)}/chat/completions"
        body = _asking_for_ids(request)
        return _chat_result(await request_json(self.session(), "POST", url, key, body))

    async def trajectory(self, rollout_id: str) -> Trajectory:
        answer = await self._admin("GET", f"{self._admin_url(rollout_id)}/trajectory")
        return Trajectory.model_validate(answer)

    async def cancel(self, rollout_id: str) -> None:
        await self._admin("POST", f"{self._admin_url(rollout_id)}/cancel")

    async def unregister(self, rollout_id: str) -> None:
        await self._admin("POST", f"{self._admin_url(rollout_id)}/unregister")
        self._keys.pop(rollout_id, None)
        self._base_urls.pop(rollout_id, None)

    async def take_lease(self, exp_id: str, holder: LeaseHolder, ttl_s: float) -> None:
        """Hold ``exp_id`` here for ``holder``, or renew its hold; ``ExperimentInUseError``
        naming the holder while another client holds it."""
        body = {"holder": holder.model_dump(mode="json"), "ttl_s": ttl_s}
        await self._admin("POST", f"{self.url}/v1/experiments/{exp_id}/lease", body)

    async def release_lease(self, exp_id: str, holder: LeaseHolder) -> None:
        body = {"holder_id": holder.id}
        await self._admin("POST", f"{self.url}/v1/experiments/{exp_id}/release", body)

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        """Pause, load, resume the served gateway's engine; ``new.source`` is a folder path the
        engine can read (in-memory weights cannot cross HTTP). Returns what the update did."""
        answer = await self._admin("POST", f"{self.url}/admin/weights", served_body(new))
        return WeightUpdate.from_dict(answer)

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self._admin("POST", f"{self.url}/admin/pause", {"mode": mode})

    async def resume(self) -> None:
        await self._admin("POST", f"{self.url}/admin/resume")

    async def policy(self) -> PolicyState:
        """The engine's policy version (None: no versions), pause state and pause modes."""
        return PolicyState.from_dict(await self._admin("GET", f"{self.url}/admin/policy"))

    async def health(self) -> bool:
        """Whether the gateway answers its liveness route (rollouts wait while it does not)."""
        return await self._health_answer() is not None

    async def engine_health(self) -> bool:
        """Whether the engine behind the gateway serves, as the gateway's health says
        (rollouts wait while it does not). True while the gateway itself does not answer:
        that outage is the gateway's (``health``), and the engine's is known once it does."""
        try:
            answer = await self._health_answer()
        except (aiohttp.ClientError, TimeoutError):
            return True
        return answer is None or answer.get("engine") != "down"

    async def _health_answer(self) -> dict[str, Any] | None:
        """The body of a 200 from ``/health`` ({} when it is not a JSON object); None for
        another status."""
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with self.session().get(f"{self.url}/health", timeout=timeout) as response:
            if response.status != 200:
                return None
            raw = await response.read()
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
        return answer if isinstance(answer, dict) else {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _admin(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        return await request_json(self.session(), method, url, self.admin_key, body)


def _check(url: str, admin_key: str) -> str:
    """The served model's name; ``ConfigError`` naming what is wrong otherwise."""
    try:
        health = httpx.get(f"{url}/health", timeout=10)
        metrics = httpx.get(
            f"{url}/metrics", headers={"Authorization": f"Bearer {admin_key}"}, timeout=10
        )
    except httpx.HTTPError as exc:
        raise ConfigError(f"no gateway at {url}: {exc}") from exc
    if metrics.status_code == 401:
        raise ConfigError(f"the gateway at {url} refused the admin key")
    try:
        model = health.json().get("model")
    except (ValueError, AttributeError):
        model = None
    if health.status_code != 200 or metrics.status_code != 200 or not model:
        raise ConfigError(f"{url} does not look like a rollway gateway")
    return str(model)
