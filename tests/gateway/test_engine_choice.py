"""The client's ``engine`` argument is sorted once (``EngineChoice.of``) into what executors
ask for: a spec each process builds from, a shared gateway that pickles as its address, or an
in-process object that stays where it is."""

from __future__ import annotations

import pickle

from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway
from rollway.gateway.engine_choice import EngineChoice
from rollway.gateway.handle import LocalGateway
from rollway.gateway.render.chat_template import ChatRenderer
from tests.conftest import Served


def test_a_spec_is_built_in_each_process_and_closed_with_it() -> None:
    for spec, per_worker in [("sim", True), ("embedded", True), ("vllm://h:1", False)]:
        choice = EngineChoice.of(spec, "some/model")
        assert (choice.spec, choice.model, choice.shared, choice.in_process) == (
            spec,
            "some/model",
            None,
            None,
        )
        assert choice.owns_engine and choice.engine_per_worker is per_worker
        assert pickle.loads(pickle.dumps(choice)) == choice
    handle = EngineChoice.of("sim").handle()
    assert isinstance(handle, LocalGateway) and isinstance(handle.gateway.engine, SimEngine)


def test_objects_stay_in_process_and_are_not_closed_with_the_client(
    renderer: ChatRenderer,
) -> None:
    engine = SimEngine(SimConfig())
    gateway = Gateway(engine, renderer, model_name="sim")
    ready = EngineChoice.of(gateway)
    assert ready.in_process is gateway and not ready.owns_engine and not ready.engine_per_worker
    handle = ready.handle()
    assert isinstance(handle, LocalGateway) and handle.gateway is gateway
    assert ready.describe() == "a Gateway object"
    built = EngineChoice.of(engine).handle()
    assert isinstance(built, LocalGateway) and built.gateway.engine is engine


def test_a_shared_gateway_pickles_as_its_address_and_key(served: Served) -> None:
    from rollway.gateway import RemoteGateway

    remote = RemoteGateway(served.url, admin_key=served.admin_key)
    choice = EngineChoice.of(remote)
    assert choice.handle() is remote and choice.shared is remote and not choice.owns_engine
    shipped = pickle.loads(pickle.dumps(choice)).shared
    assert (shipped.url, shipped.admin_key, shipped._session) == (
        remote.url,
        remote.admin_key,
        None,
    )
    assert choice.describe() == f"the shared gateway at {served.url}"
