"""The gateway as a rollout sees it: one async surface (``GatewayHandle``) over the in-process
``Gateway`` (``LocalGateway``, here) and a served one (``remote_gateway.RemoteGateway``)."""

from __future__ import annotations

from typing import Any, Protocol

from rollway.engines.base import PauseMode
from rollway.gateway.chat_answer import Registration
from rollway.gateway.core import Gateway
from rollway.gateway.request_schema import RegisterRequest
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate
from rollway.generation import ChatResult
from rollway.trajectory import Trajectory


class GatewayHandle(Protocol):
    model_name: str
    #: The gateway's Unix socket on this machine, if it has one (network-isolated sandboxes).
    socket_path: str | None

    def base_url(self, rollout_id: str) -> str | None:
        """The rollout's OpenAI base URL, or None when the gateway is not served over HTTP."""
        ...

    async def register(
        self, rollout_id: str, params: RegisterRequest, *, reuse: bool = False
    ) -> Registration: ...

    async def chat(self, rollout_id: str, request: dict[str, Any]) -> ChatResult: ...

    async def trajectory(self, rollout_id: str) -> Trajectory: ...

    async def cancel(self, rollout_id: str) -> None: ...

    async def unregister(self, rollout_id: str) -> None: ...

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        """Pause the engine (``new.mode``), load ``new.source`` as ``new.version``, resume."""
        ...

    async def pause(self, mode: PauseMode = "abort") -> None: ...

    async def resume(self) -> None: ...

    async def policy(self) -> PolicyState: ...


class LocalGateway:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.model_name = gateway.model_name
        #: Where the client serves it over HTTP (and a Unix socket), once it does.
        self.url: str | None = None
        self.socket_path: str | None = None

    def base_url(self, rollout_id: str) -> str | None:
        return f"{self.url}/v1/rollouts/{rollout_id}" if self.url else None

    async def register(
        self, rollout_id: str, params: RegisterRequest, *, reuse: bool = False
    ) -> Registration:
        return self.gateway.register(rollout_id, params, reuse=reuse)

    async def chat(self, rollout_id: str, request: dict[str, Any]) -> ChatResult:
        return await self.gateway.chat(rollout_id, request)

    async def trajectory(self, rollout_id: str) -> Trajectory:
        return await self.gateway.trajectory(rollout_id)

    async def cancel(self, rollout_id: str) -> None:
        await self.gateway.cancel(rollout_id)

    async def unregister(self, rollout_id: str) -> None:
        await self.gateway.unregister(rollout_id)

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        weights = self.gateway.weights
        return await weights.update(new.source, new.version, new.mode, loaded=new.loaded)

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self.gateway.weights.pause(mode)

    async def resume(self) -> None:
        await self.gateway.weights.resume()

    async def policy(self) -> PolicyState:
        return self.gateway.weights.describe()
