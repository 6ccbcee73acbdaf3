"""Token-level generation backends behind one small interface (``base.Engine``)."""

from rollway.engines.base import Engine
from rollway.engines.factory import engine_from_spec
from rollway.engines.scripted import ScriptedEngine
from rollway.engines.sim import SimConfig, SimEngine

__all__ = ["Engine", "ScriptedEngine", "SimConfig", "SimEngine", "engine_from_spec"]
