"""Rollouts in this process, on the client's event loop: the default executor, and what each
Ray worker runs inside."""

from __future__ import annotations

import asyncio
import functools
import secrets
from typing import Any

from starlette.applications import Starlette

from rollway.agents.base import AgentLoop
from rollway.agents.server.callback_inbox import CallbackInbox
from rollway.agents.server.remote_agent import RemoteAgent
from rollway.engines.base import HealthChecked
from rollway.events import EventBus
from rollway.executors.base import WorkerConfig
from rollway.gateway.handle import GatewayHandle, LocalGateway
from rollway.gateway.http.gateway_app import create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate
from rollway.loop_thread import LoopThread
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutRunner, RolloutSpec
from rollway.rollouts.availability import Availability, Component
from rollway.rollouts.runner import RunningAttempts
from rollway.web.background_server import LoopServer


class LocalExecutor:
    """Owns the gateway (in-process, or a ``RemoteGateway``), the HTTP server that programs and
    agent servers reach it on, and the callback route for agent servers."""

    light_records = False

    def __init__(self) -> None:
        self.model_name = ""
        self._setup: WorkerConfig | None = None
        self._gateway: GatewayHandle | None = None
        self._inbox: CallbackInbox | None = None
        self._http: LoopServer | None = None
        self._runner: RolloutRunner | None = None
        self._events = EventBus()
        #: What the rollouts wait for while it is down (the status lines show it).
        self.availability = Availability()

    @property
    def gateway(self) -> GatewayHandle:
        if self._gateway is None:
            raise RuntimeError("the executor has not started")
        return self._gateway

    def start(self, setup: WorkerConfig, loop: LoopThread, events: EventBus) -> None:
        self.prepare(setup, events)
        loop.call(self.serve())

    def prepare(self, setup: WorkerConfig, events: EventBus) -> None:
        """The blocking part of starting (an embedded engine loads its model here)."""
        self._setup, self._events = setup, events
        self._gateway = setup.engine.handle()
        self.model_name = self._gateway.model_name
        if isinstance(self._gateway, LocalGateway):  # a served gateway's turns stay there
            self._gateway.gateway.events.subscribe(events)
        agent = setup.agent
        self.availability = Availability(components(self._gateway, agent))
        if isinstance(agent, RemoteAgent):
            self._inbox = CallbackInbox() if setup.serving.callback else None
            is_down = functools.partial(self.availability.is_down, agent_server(agent))
            agent.bind(setup.store, self._inbox, setup.settings, is_down)
        self._runner = RolloutRunner(
            agent,
            self._gateway,
            setup.store,
            setup.settings,
            setup.reward,
            events,
            RunningAttempts(),
            self.availability,
        )

    async def serve(self, advertise_host: str | None = None) -> None:
        """Serve what out-of-process parties need: the in-process gateway (programs, agent
        servers) and the callback route (agent servers). ``advertise_host`` replaces the bound
        host in the URLs handed out (a Ray worker bound to 0.0.0.0 gives its node's IP)."""
        setup = self._setup
        assert setup is not None, "prepare first"
        serving = setup.serving
        serve_gateway = serving.http
        if serve_gateway is None:
            serve_gateway = setup.agent.needs_http
        routes = [self._inbox.route()] if self._inbox is not None else []
        local = self._gateway if serve_gateway and isinstance(self._gateway, LocalGateway) else None
        if local is not None:
            app = create_app(
                local.gateway,
                admin_key=secrets.token_hex(16),
                close_engine=False,
                extra_routes=routes,
            )
        elif routes:
            app = Starlette(routes=routes)
        else:
            return
        # The gateway on a Unix socket too, for sandboxes whose only way out is a relay to it.
        server = LoopServer(
            app, host=serving.host, port=serving.port, unix_socket=local is not None
        )
        bound = await server.start()
        if serving.public_url:
            url = serving.public_url.rstrip("/")
        elif advertise_host:
            url = f"http://{advertise_host}:{bound.rsplit(':', 1)[1]}"
        else:
            url = bound
        if local is not None:
            local.url, local.socket_path = url, server.unix_path
        if self._inbox is not None:
            self._inbox.url = url
        self._http = server

    async def run(
        self, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        runner = self._runner
        assert runner is not None, "start first"
        if settings != runner.settings:  # overrides of one invoke or batch
            runner = RolloutRunner(
                runner.agent,
                runner.gateway,
                runner.store,
                settings,
                runner.reward_fn,
                runner.events,
                runner.attempts,
                runner.availability,
            )
        return await runner.run(spec, cancel)

    def abort(self, rollout_id: str, reason: str) -> bool:
        """Stop a running attempt, recorded as a ``timeout`` with ``reason``."""
        assert self._runner is not None, "start first"
        return self._runner.attempts.abort(rollout_id, reason)

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        return await self.gateway.update_weights(new)

    async def policy(self) -> PolicyState:
        return await self.gateway.policy()

    def close(self, loop: LoopThread) -> None:
        loop.call(self.aclose())

    async def aclose(self) -> None:
        setup = self._setup
        if setup is None:
            return
        self._setup = None
        await self.availability.aclose()
        if isinstance(self._gateway, LocalGateway):  # it may outlive this client
            self._gateway.gateway.events.unsubscribe(self._events)
        if self._http is not None:
            await self._http.stop()
        if isinstance(setup.agent, RemoteAgent):
            await setup.agent.aclose()
        if isinstance(self._gateway, RemoteGateway):
            await self._gateway.close()
        elif isinstance(self._gateway, LocalGateway) and setup.engine.owns_engine:
            await self._gateway.gateway.engine.close()  # built here, from a spec

    def describe(self) -> dict[str, Any]:
        return {"executor": "local"}


def components(gateway: GatewayHandle, agent: AgentLoop) -> list[Component]:
    """What this executor's rollouts need up, each with its health probe: a shared gateway and
    the engine behind it (as its health says), else the in-process gateway's engine when it can
    say whether it serves; an agent server."""
    found = []
    if isinstance(gateway, RemoteGateway):
        name = f"the shared gateway at {gateway.url}"
        found.append(Component(name, "infrastructure", gateway.health))
        found.append(Component(f"the engine behind {name}", "engine", gateway.engine_health))
    elif isinstance(gateway, LocalGateway) and isinstance(gateway.gateway.engine, HealthChecked):
        engine = gateway.gateway.engine
        where = getattr(engine, "base_url", None)
        name = f"the engine at {where}" if where else "the engine"
        found.append(Component(name, "engine", engine.health))
    if isinstance(agent, RemoteAgent):
        found.append(agent_server(agent))
    return found


def agent_server(agent: RemoteAgent) -> Component:
    return Component(f"the agent server at {agent.url}", "infrastructure", agent.health)
