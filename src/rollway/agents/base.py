"""The agent seam: an ``AgentLoop`` subclass names itself, lists its tools and runs a rollout."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rollway.agents.tools import DEFERRED_PROBLEMS, Tool
from rollway.results import AgentResult

if TYPE_CHECKING:
    from rollway.agents.context import RolloutContext


class AgentLoop(ABC):
    """Base of in-process agents.

    A concrete subclass must set a non-empty ``name`` (``TypeError`` at class definition
    otherwise; abstract intermediates are exempt) and implement ``async run(ctx)``, returning
    ``ctx.complete(...)`` or ``ctx.error(...)``. Tools: set ``tools`` to ``@tool`` functions,
    or override ``get_tools(task)`` to return OpenAI function schemas per task.
    """

    name: ClassVar[str] = ""
    tools: ClassVar[Sequence[Tool]] = ()
    #: The agent reaches the gateway over HTTP (a program, an agent server): the client
    #: serves its gateway for it.
    needs_http: ClassVar[bool] = False
    #: A rollout left open on a shared gateway by a client that died is picked up again by
    #: its id rather than run anew (the agent's work lives elsewhere and may be running).
    reattaches: ClassVar[bool] = False
    #: The agent lends its environment (a sandbox) to a reward that uses it
    #: (``@uses_environment``): set ``ctx.environment`` when ``ctx.keep_environment`` asks.
    lends_environment: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        named = isinstance(cls.name, str) and cls.name.strip()
        # Under rollway validate the class is kept, and its missing name reported with the rest.
        if not named and not _is_abstract(cls) and not DEFERRED_PROBLEMS.get():
            raise TypeError(f"agent class {cls.__qualname__} must set a non-empty `name`")

    def get_tools(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        """OpenAI function tool schemas offered for ``task``."""
        return [t.schema for t in self.tools]

    def get_default_tools(self) -> list[dict[str, Any]]:
        """The tools for an empty task, for discovery."""
        return self.get_tools({})

    @abstractmethod
    async def run(self, ctx: RolloutContext) -> AgentResult:
        """Run one rollout of ``ctx.task``."""

    async def stop(self, ctx: RolloutContext) -> None:
        """The rollout is being stopped (timeout or cancel): end ``run`` promptly. By default
        nothing: the gateway already refuses the rollout's next model call, and ``run`` is
        cancelled after a grace period. Agents that work elsewhere (a server) say so here."""
        return


def _is_abstract(cls: type) -> bool:
    # ABCMeta computes __abstractmethods__ only after __init_subclass__ runs, so look ourselves.
    return any(
        getattr(getattr(cls, attr, None), "__isabstractmethod__", False) for attr in dir(cls)
    )
