"""OpenTelemetry traces across the flow: rollout -> turn -> engine request, one trace across
HTTP (program agents, agent servers, remote engines), exported over OTLP; nothing when off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollway import tracing
from rollway.agents import AgentLoop, RolloutContext
from rollway.agents.program import ProgramAgent
from rollway.agents.server import create_app as create_agent_app
from rollway.client import RolloutClient
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.sim import SimConfig
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult, RolloutRecord
from rollway.simulators import create_sim_server_app
from rollway.web.background_server import BackgroundServer, LoopServer
from tests.agents.server.agents import TaskDrivenAgent
from tests.agents.server.fixtures import KEY, AgentServer
from tests.cli.test_gateway_command import free_port
from tests.conftest import sim_gateway
from tests.outcomes import ENDED

ROOT = Path(__file__).resolve().parents[1]


class TwoChats(AgentLoop):
    name = "two-chats"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hi."}]
        for _ in range(2):
            reply = await ctx.chat(messages, max_tokens=4)
            messages += [reply.message, {"role": "user", "content": "Again."}]
        return ctx.complete(messages)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    yield exporter
    tracing.disable()
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def run_one(agent: AgentLoop | str, gateway: Gateway, tmp_path: Path, **kw: Any) -> RolloutRecord:
    with RolloutClient(agent, gateway, store=str(tmp_path), seed=1, **kw) as client:
        return client.invoke({"task_id": "t1"}).result(60)


def test_a_rollout_is_one_span_tree_down_to_its_engine_requests(
    spans: InMemorySpanExporter, gateway: Gateway, tmp_path: Path
) -> None:
    record = run_one(TwoChats(), gateway, tmp_path)
    assert record.status in ENDED, record.reason
    (rollout,) = named(spans, "rollway.rollout")
    assert rollout.attributes is not None
    assert dict(rollout.attributes) == {
        "rollway.rollout_id": record.rollout_id,
        "rollway.attempt": 1,
        "rollway.rollout_key": record.rollout_key,
        "rollway.group_id": record.group_id,
        "rollway.status": record.status,
    }
    turns = sorted(named(spans, "rollway.gateway.turn"), key=lambda s: s.start_time or 0)
    requests = {
        s.attributes["rollway.request_id"]: s for s in named(spans, "rollway.engine.request")
    }  # type: ignore[index]
    assert record.trajectory is not None
    recorded = record.trajectory.turns
    assert len(turns) == len(recorded) == len(requests) == 2
    for number, (span, turn) in enumerate(zip(turns, recorded, strict=True)):
        assert span.context.trace_id == rollout.context.trace_id
        assert parent_id(span) == rollout.context.span_id
        assert span.attributes == {
            "rollway.rollout_id": record.rollout_id,
            "rollway.turn": number,
            "rollway.turn_index": turn.index,
            "rollway.finish_reason": turn.finish_reason,
            "gen_ai.usage.input_tokens": turn.prompt_len,
            "gen_ai.usage.output_tokens": len(turn.completion_ids),
        }
        request = requests[turn.request_id]
        assert parent_id(request) == span.context.span_id
        assert request.attributes["rollway.engine"] == "EmbeddedEngine"  # type: ignore[index]


def test_a_program_agent_joins_the_trace_by_its_traceparent_or_its_rollout(
    spans: InMemorySpanExporter, gateway: Gateway, tmp_path: Path
) -> None:
    # The program makes its own span id under the TRACEPARENT it was given and sends it with
    # its first call; its second call sends none, as an uninstrumented program would.
    program = tmp_path / "prog.py"
    program.write_text(
        textwrap.dedent("""
        import json, os, urllib.request
        version, trace_id, parent, flags = os.environ["TRACEPARENT"].split("-")
        mine = f"{version}-{trace_id}-{'ab' * 8}-{flags}"
        for headers in ({"traceparent": mine}, {}):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            request = urllib.request.Request(
                os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json", **headers})
            urllib.request.urlopen(request).read()
    """)
    )
    record = run_one(ProgramAgent([sys.executable, str(program)]), gateway, tmp_path)
    assert record.status in ENDED, record.reason
    (rollout,) = named(spans, "rollway.rollout")
    first, second = sorted(named(spans, "rollway.gateway.turn"), key=lambda s: s.start_time or 0)
    trace_id = rollout.context.trace_id
    assert first.context.trace_id == second.context.trace_id == trace_id
    assert parent_id(first) == int("ab" * 8, 16)
    assert parent_id(second) == rollout.context.span_id
    assert first.attributes["rollway.rollout_id"] == record.rollout_id  # type: ignore[index]


def test_an_agent_server_joins_the_trace_both_ways(
    spans: InMemorySpanExporter,
    agent_server: Any,
    renderer: ChatRenderer,
    gateway: Gateway,
    tmp_path: Path,
) -> None:
    server: AgentServer = agent_server()
    with RolloutClient(server.url, gateway, store=str(tmp_path), agent_key=KEY) as client:
        record = client.invoke({"task_id": "t1", "chats": 2, "q": "hi"}, max_tokens=3).result(60)
    assert record.status in ENDED, record.reason
    (rollout,) = named(spans, "rollway.rollout")
    (served,) = named(spans, "rollway.agent.run")
    turns = named(spans, "rollway.gateway.turn")
    assert served.attributes["rollway.rollout_id"] == record.rollout_id  # type: ignore[index]
    assert served.context.trace_id == rollout.context.trace_id
    assert parent_id(served) == rollout.context.span_id
    assert len(turns) == 2
    assert {parent_id(turn) for turn in turns} == {served.context.span_id}
    assert {turn.context.trace_id for turn in turns} == {rollout.context.trace_id}


async def test_a_request_without_trace_context_never_inherits_the_servers_own_span(
    spans: InMemorySpanExporter, renderer: ChatRenderer
) -> None:
    gateway = sim_gateway(renderer, output_len=2)
    app = create_app(gateway, admin_key="admin", close_engine=False)
    with tracing.span("started the server"):
        server = LoopServer(app)  # its task, and so each request, starts in this span
        url = await server.start()
    try:
        with tracing.span("registered"):
            key = gateway.register("r", {"max_tokens": 2}).api_key
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{url}/v1/rollouts/r/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
            )
        assert answer.status_code == 200
    finally:
        await server.stop()
    (registered,) = named(spans, "registered")
    (turn,) = named(spans, "rollway.gateway.turn")
    assert parent_id(turn) == registered.context.span_id


def test_servers_export_their_buffered_spans_as_they_shut_down(renderer: ChatRenderer) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    # Batched as an OTLP export is, and never sent on a timer within the test.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    tracing.enable(provider)
    try:
        gateway_app = create_app(sim_gateway(renderer, output_len=2), admin_key="admin")
        with BackgroundServer(gateway_app) as url:
            admin = {"Authorization": "Bearer admin"}
            key = httpx.post(f"{url}/v1/rollouts/r/register", json={}, headers=admin).json()
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            answer = httpx.post(
                f"{url}/v1/rollouts/r/chat/completions", json=chat,
                headers={"Authorization": f"Bearer {key['api_key']}"},
            )  # fmt: skip
            assert answer.status_code == 200 and exporter.get_finished_spans() == ()
        names = {span.name for span in exporter.get_finished_spans()}
        assert names == {"rollway.gateway.turn", "rollway.engine.request"}
        exporter.clear()
        agent_app = create_agent_app(TaskDrivenAgent, api_key=KEY)
        with BackgroundServer(agent_app) as url, httpx.Client(base_url=url) as http:
            server = AgentServer(url, agent_app.state.service, http)
            assert server.init("a1").status_code == 202
            server.wait_finished("a1")
            assert exporter.get_finished_spans() == ()
        assert [span.name for span in exporter.get_finished_spans()] == ["rollway.agent.run"]
    finally:
        tracing.disable()
        provider.shutdown()


class HeaderLog:
    """An ASGI wrapper that keeps each request's ``traceparent`` header."""

    def __init__(self, app: Any) -> None:
        self.app, self.seen = app, list[tuple[str, str | None]]()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            value = headers.get(b"traceparent")
            self.seen.append((scope["path"], value.decode() if value else None))
        await self.app(scope, receive, send)


async def test_a_remote_engine_request_carries_its_span_as_traceparent(
    spans: InMemorySpanExporter, renderer: ChatRenderer
) -> None:
    logged = HeaderLog(create_sim_server_app(SimConfig(output_len=3), protocol="sglang"))
    with BackgroundServer(logged) as url:
        gateway = Gateway(SGLangEngine(url), renderer, model_name="sim")
        try:
            gateway.register("r", {"max_tokens": 3})
            await gateway.chat("r", {"messages": [{"role": "user", "content": "hi"}]})
        finally:
            await gateway.engine.close()
    (request,) = named(spans, "rollway.engine.request")
    assert request.attributes["rollway.engine.endpoint"] == f"{url}/generate"  # type: ignore[index]
    context = request.context
    sent = [header for path, header in logged.seen if path == "/generate"]
    flags = int(context.trace_flags)
    assert sent == [f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"]


def test_tracing_off_records_nothing(gateway: Gateway, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    tracing.disable()
    try:
        record = run_one(TwoChats(), gateway, tmp_path)
    finally:
        provider.shutdown()
    assert record.status in ENDED and exporter.get_finished_spans() == ()


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


#: A program agent's one chat call, over the gateway's HTTP route.
ONE_CHAT_PROGRAM = """
import json, os, urllib.request
body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
    {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
urllib.request.urlopen(request).read()
"""


def test_with_tracing_off_the_client_never_imports_opentelemetry(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_text(ONE_CHAT_PROGRAM)
    # A program agent: the served gateway, its routes and the program's environment run too.
    code = f"""
        import sys
        from rollway.agents.program import ProgramAgent
        from rollway.client import RolloutClient

        agent = ProgramAgent([sys.executable, "{program}"])
        with RolloutClient(agent, "sim", store="{tmp_path}") as client:
            record = client.invoke({{"task_id": "t1"}}).result(60)
        assert record.status in ("completed", "truncated"), record
        assert len(record.trajectory.turns) == 1, record
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
    """
    done = run_python(code, ROLLWAY_TRACE="")
    assert done.returncode == 0, done.stderr


class Collector:
    """An OTLP/HTTP trace receiver on loopback: keeps the spans' names, attributes and the
    service that sent them."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, Any]]] = []
        self.services: set[str] = set()
        #: Each span's trace id and parent span id, as hex.
        self.parents: list[tuple[str, tuple[str, str]]] = []

    async def traces(self, request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            self.services.add(resource["service.name"])
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    values = {a.key: a.value.string_value for a in span.attributes}
                    self.spans.append((span.name, values))
                    parent = (span.trace_id.hex(), span.parent_span_id.hex())
                    self.parents.append((span.name, parent))
        return Response(b"", media_type="application/x-protobuf")


def test_rollway_run_trace_exports_to_the_otlp_collector_the_environment_names(
    tmp_path: Path,
) -> None:
    collector = Collector()
    app = Starlette(routes=[Route("/v1/traces", collector.traces, methods=["POST"])])
    agent = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
    tasks = ROOT / "examples" / "calculator" / "tasks.jsonl"
    args = ["run", agent, "--tasks", str(tasks), "--limit", "1", "--engine", "sim",
            "--max-tokens", "4", "--out", str(tmp_path), "--trace"]  # fmt: skip
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_SERVICE_NAME": "rollway-test"}
    with BackgroundServer(app) as url:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = url
        done = subprocess.run(
            [sys.executable, "-m", "rollway", *args], env=env, cwd=tmp_path,
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    index = next(tmp_path.rglob("index.jsonl")).read_text().splitlines()
    (record,) = [orjson.loads(line) for line in index]
    names = [name for name, _ in collector.spans]
    assert names.count("rollway.rollout") == 1
    turns = names.count("rollway.gateway.turn")
    assert turns >= 1 and names.count("rollway.engine.request") == turns
    traced = {a["rollway.rollout_id"] for n, a in collector.spans if n != "rollway.engine.request"}
    assert traced == {record["rollout_id"]}
    assert collector.services == {"rollway-test"}


def test_a_served_gateway_traced_by_env_parents_turns_by_header_or_registration() -> None:
    collector = Collector()
    app = Starlette(routes=[Route("/v1/traces", collector.traces, methods=["POST"])])
    registered = f"00-{'1' * 32}-{'2' * 16}-01"
    own = f"00-{'1' * 32}-{'3' * 16}-01"
    with BackgroundServer(app) as collector_url:
        env = {k: v for k, v in os.environ.items() if k != "ROLLWAY_ADMIN_KEY"}
        env.update(ROLLWAY_TRACE="1", OTEL_EXPORTER_OTLP_ENDPOINT=collector_url)
        port = free_port()
        cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", "sim", "--port", str(port)]
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as gateway:
            assert gateway.stdout is not None
            url = f"http://127.0.0.1:{port}"
            gateway.stdout.readline()  # the address
            admin = {"Authorization": f"Bearer {gateway.stdout.readline().split()[-1]}"}
            try:
                with httpx.Client(base_url=url, transport=httpx.HTTPTransport(retries=50)) as http:
                    reply = http.post(
                        "/v1/rollouts/r/register", json={"max_tokens": 2},
                        headers={**admin, "traceparent": registered},
                    )  # fmt: skip
                    key = {"Authorization": f"Bearer {reply.json()['api_key']}"}
                    chat = {"messages": [{"role": "user", "content": "hi"}]}
                    for headers in ({}, {"traceparent": own}):
                        answer = http.post(
                            "/v1/rollouts/r/chat/completions", json=chat,
                            headers={**key, **headers},
                        )  # fmt: skip
                        assert answer.status_code == 200, answer.text
            finally:
                gateway.terminate()  # its shutdown flushes the spans
            gateway.wait(60)
    turns = [a for name, a in collector.parents if name == "rollway.gateway.turn"]
    assert turns == [("1" * 32, "2" * 16), ("1" * 32, "3" * 16)]


def test_a_bad_exporter_name_is_a_config_error() -> None:
    done = run_python(
        "from rollway import tracing; tracing.enable()", OTEL_TRACES_EXPORTER="zipkinish"
    )
    assert done.returncode != 0 and "rollway exports otlp, console or none" in done.stderr


def test_a_ray_worker_traces_when_its_client_does(tmp_path: Path) -> None:
    # The worker body as a Ray actor runs it, in a fresh process: the setup says to trace.
    code = f"""
        from rollway import tracing
        from rollway.executors.base import WorkerConfig
        from rollway.executors.worker import RolloutWorker
        from rollway.gateway.engine_choice import EngineChoice
        from rollway.rollouts import RolloutConfig
        from rollway.store.factory import store_from_uri
        from tests.agents.server.agents import TaskDrivenAgent

        def worker(trace):
            setup = WorkerConfig(
                agent=TaskDrivenAgent(), engine=EngineChoice.of("sim"),
                store=store_from_uri("{tmp_path}", "exp"), settings=RolloutConfig.build("exp"),
                trace=trace,
            )
            RolloutWorker(setup)
            return tracing.enabled()

        print(worker(False), worker(True))
    """
    done = run_python(code, OTEL_TRACES_EXPORTER="none", ROLLWAY_TRACE="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


async def test_a_streamed_turn_is_one_span_under_the_requests_trace(
    spans: InMemorySpanExporter, renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = sim_gateway(renderer, output_len=6, per_token_s=0.01)
    app = create_app(gateway, admin_key="admin", close_engine=False)
    server = LoopServer(app)
    url = await server.start()
    parent = f"00-{'4' * 32}-{'5' * 16}-01"
    try:
        key = gateway.register("r", {"max_tokens": 6}).api_key
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {key}", "traceparent": parent}
        async with (
            httpx.AsyncClient() as http,
            http.stream(
                "POST", f"{url}/v1/rollouts/r/chat/completions", json=body, headers=headers
            ) as answer,
        ):
            events = [line async for line in answer.aiter_lines() if line.startswith("data:")]
        assert answer.status_code == 200 and events[-1] == "data: [DONE]"
    finally:
        await server.stop()
    (turn,) = named(spans, "rollway.gateway.turn")
    assert turn.attributes is not None and turn.attributes["rollway.stream"] is True
    assert turn.attributes["gen_ai.usage.output_tokens"] == 6
    assert f"{turn.context.trace_id:032x}" == "4" * 32 and parent_id(turn) == int("5" * 16, 16)
    # The span was never made current across the stream's yields: nothing to detach wrongly.
    assert not [r for r in caplog.records if "detach" in r.getMessage().lower()]
