"""The client's ``engine`` argument, sorted once where the client takes it (``EngineChoice.of``):
executors ask the choice for what they need (a gateway handle, the shared gateway, whether each
worker owns an engine) instead of sorting five types themselves."""

from __future__ import annotations

from dataclasses import dataclass

from rollway.engines.base import ChatEngine, Engine
from rollway.gateway.core import Gateway
from rollway.gateway.factory import build_gateway
from rollway.gateway.handle import GatewayHandle, LocalGateway
from rollway.gateway.remote_gateway import RemoteGateway

#: What ``RolloutClient(agent, engine)`` takes as ``engine``.
EngineArgument = str | Engine | ChatEngine | Gateway | RemoteGateway

#: Engines of these schemes live inside each process that builds them (one per Ray worker).
_OWN_ENGINE_SCHEMES = ("embedded", "sim")


@dataclass(frozen=True)
class EngineChoice:
    """Exactly one of: ``spec``, an engine spec every process builds its own gateway from
    (``model`` names its tokenizer); ``shared``, a served gateway (``rollway gateway``), which
    pickles as its address and key; ``in_process``, an engine object or a ready gateway, which
    stays in this process (a Ray executor refuses it)."""

    spec: str | None = None
    model: str | None = None
    shared: RemoteGateway | None = None
    in_process: Engine | ChatEngine | Gateway | None = None

    @classmethod
    def of(cls, engine: EngineArgument, model: str | None = None) -> EngineChoice:
        if isinstance(engine, str):
            return cls(spec=engine, model=model)
        if isinstance(engine, RemoteGateway):
            return cls(shared=engine, model=model)
        return cls(in_process=engine, model=model)

    def handle(self) -> GatewayHandle:
        """The gateway this process's rollouts run through (built here from a spec, which
        loads an embedded engine's model)."""
        if self.shared is not None:
            return self.shared
        if isinstance(self.in_process, Gateway):
            return LocalGateway(self.in_process)
        engine = self.in_process if self.in_process is not None else self.spec or "embedded"
        return LocalGateway(build_gateway(engine, model=self.model))

    @property
    def owns_engine(self) -> bool:
        """Whether the engine is built from the spec, so closed with the client's gateway."""
        return self.spec is not None

    @property
    def engine_per_worker(self) -> bool:
        """Whether every worker builds an engine of its own (``embedded``, ``sim``), rather
        than reaching servers that the workers share."""
        return self.spec is not None and self.spec.partition("://")[0] in _OWN_ENGINE_SCHEMES

    def describe(self) -> str:
        """The engine named for a message: its spec, the shared gateway's URL, or its type."""
        if self.shared is not None:
            return f"the shared gateway at {self.shared.url}"
        if self.in_process is not None:
            return f"a {type(self.in_process).__name__} object"
        return repr(self.spec)
