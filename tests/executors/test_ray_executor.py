"""The Ray executor on a real local Ray cluster started here: same outcomes as the local
executor, limits across the cluster, workers killed mid-batch, cancellation and timeouts, a shared
gateway, and what travels to workers.

A worker that builds its own engine (even ``sim``, for its tokenizer) imports torch and
transformers, and ``embedded`` loads the model: 5-10 s of CPU per worker, which dominated this
file. So tests whose claim is about a worker's own engine or model build one, on two workers
only where the claim spans workers; the others share the session's served gateway, and their
workers import neither."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import ray

from rollway.agents.program import ProgramAgent
from rollway.agents.registry import import_target, load_agent
from rollway.agents.server.remote_agent import resolve_agent
from rollway.client import BatchItem, RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.errors import ConfigError
from rollway.events import RolloutEvent
from rollway.executors import RayExecutor
from rollway.gateway import Gateway
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.store import store_from_uri
from rollway.trajectory_format import whole_prompts
from tests.agents.server.fixtures import KEY, wait_until
from tests.conftest import Served
from tests.executors.agents import DyingStore, ProbeAgent, events, peak_concurrency
from tests.outcomes import ENDED

CALCULATOR = "examples/calculator/agent.py:CalculatorAgent"
CALC_TASKS = [
    {"task_id": "add", "question": "What is 11 + 14?", "answer": 25},
    {"task_id": "mul", "question": "What is 6 * 7?", "answer": 42},
]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    # Logical CPUs: two workers of one CPU each, with room for restarts and probe tasks.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")  # fmt: skip  # never another file's cluster
    yield
    ray.shutdown()


def two_workers(**options: object) -> RayExecutor:
    return RayExecutor(num_workers=2, resources_per_worker={"CPU": 1}, **options)  # type: ignore[arg-type]


def one_worker() -> RayExecutor:
    return RayExecutor(num_workers=1, resources_per_worker={"CPU": 1})


def shared_gateway(served: Served) -> RemoteGateway:
    """The session's served gateway (the embedded model, in this process) for workers that
    need no engine of their own."""
    return RemoteGateway(served.url, admin_key=served.admin_key)


def forget_left(served: Served, exp_id: str) -> None:
    """Unregister what workers killed mid-rollout left on the session's gateway."""
    for rollout_id in [r for r in served.gateway._rollouts if r.startswith(f"{exp_id}.")]:
        url = f"{served.url}/v1/rollouts/{rollout_id}/unregister"
        httpx.post(url, headers=served.admin_headers).raise_for_status()


def run_in_thread(client: RolloutClient, tasks: list[dict], **kwargs: object) -> tuple:
    items: list[BatchItem] = []
    thread = threading.Thread(target=lambda: items.extend(client.run_batch(tasks, **kwargs)))
    thread.start()
    return thread, items


def test_a_grouped_batch_on_ray_matches_the_local_executor_token_for_token(
    ray_cluster: None, engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path, s3_env: str
) -> None:
    sampling = {"seed": 7, "max_tokens": 16, "max_turns": 3}
    local_gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    with RolloutClient(
        CALCULATOR, local_gateway, store=str(tmp_path), exp_id="calc", **sampling
    ) as client:
        local = {i.result.rollout_key: i.result for i in client.run_batch(CALC_TASKS, 2)}

    executor = two_workers()
    with RolloutClient(
        CALCULATOR, "embedded", store=s3_env, exp_id="calc", executor=executor, **sampling
    ) as client:
        items = list(client.run_batch(CALC_TASKS, group_size=2))
        summary = client.last_summary
    assert sorted(i.index for i in items) == [0, 1, 2, 3]
    assert all(w["dispatched"] == 2 for w in executor.load())  # spread by load
    stored = {r.rollout_key: r for r in store_from_uri(s3_env, "calc").records()}
    assert set(stored) == set(local) == {i.result.rollout_key for i in items}
    for item in items:
        light = item.result
        full, mine = stored[light.rollout_key], local[light.rollout_key]
        # The driver got the outcome and figures; the trajectory is only in the store.
        assert light.trajectory is None and full.trajectory is not None
        assert (light.status, light.reward, light.group_id) == (
            mine.status,
            mine.reward,
            mine.group_id,
        )
        assert (full.status, full.reward, full.attempts) == (mine.status, mine.reward, 1)
        theirs, ours = full.trajectory.turns, mine.trajectory.turns
        assert [p for _, p in whole_prompts(theirs)] == [p for _, p in whole_prompts(ours)]
        assert [t.completion_ids for t in theirs] == [t.completion_ids for t in ours]
        for a, b in zip(theirs, ours, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=2e-3)
        sampled = sum(len(t.completion_ids) for t in theirs)
        assert light.trajectory_stats.sampled_tokens == sampled > 0
        assert full.trajectory.samples[0].loss_mask == mine.trajectory.samples[0].loss_mask
    assert summary["by_status"] == dict(Counter(r.status for r in local.values()))
    assert summary["tokens_per_s"] > 0 and summary["turn_latency_p50_ms"] > 0


def test_a_worker_killed_mid_batch_loses_nothing_and_runs_nothing_twice(
    ray_cluster: None, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    tasks = [{"task_id": f"k{i}", "wait": 3.0, "log": str(log)} for i in range(8)]
    executor = two_workers()
    with RolloutClient(
        ProbeAgent, "embedded", store=str(tmp_path), exp_id="kill", executor=executor,
        max_concurrent=8, max_tokens=4, seed=1,
    ) as client:  # fmt: skip
        thread, items = run_in_thread(client, tasks)
        wait_until(lambda: len(events(log)) == 8, timeout=60)
        starts = Counter(pid for _, _, pid, _ in events(log))
        victim = executor.worker_info[0]["pid"]
        lost = starts[victim]
        assert lost > 0 and len(starts) == 2
        os.kill(victim, signal.SIGKILL)
        thread.join(timeout=120)
        after = client.invoke({"task_id": "after", "chat": False}).result(timeout=60)

    assert after.status in ENDED  # the driver kept going
    assert len(items) == 8 and all(i.result.status in ENDED for i in items)
    assert Counter(i.result.attempts for i in items) == {1: 8 - lost, 2: lost}
    # Every lost rollout ran once more, elsewhere or on the restarted worker; nothing else did.
    rows = events(log)
    assert sum(1 for row in rows if row[0] == "start") == 8 + lost
    ended = [(pid, rollout_id) for event, _, pid, rollout_id in rows if event == "end"]
    assert len(ended) == 8 and victim not in {pid for pid, _ in ended}
    assert sorted(rid for _, rid in ended) == sorted(i.result.rollout_id for i in items)
    # Exactly one record per rollout: one write each (the index gains a line per write).
    index = (tmp_path / "kill" / "index.jsonl").read_text().splitlines()
    assert len(index) == 9 and len(set(index)) == 9
    run_ids = {i.result.run_id for i in items}
    assert len(run_ids) == 1 and None not in run_ids


def test_a_rollout_recorded_by_a_worker_that_then_died_is_not_run_again(
    ray_cluster: None, served: Served, tmp_path: Path
) -> None:
    log, marker = tmp_path / "events", tmp_path / "died"
    tasks = [
        {"task_id": "d0", "chat": False, "log": str(log), "die_after_write": str(marker)},
        {"task_id": "d1", "chat": False, "log": str(log)},
    ]
    store = DyingStore(tmp_path, "dying")
    with RolloutClient(
        ProbeAgent, shared_gateway(served), store=store, exp_id="dying", executor=two_workers(),
        max_concurrent=1,
    ) as client:  # fmt: skip
        items = {i.result.rollout_key: i.result for i in client.run_batch(tasks)}
    assert marker.exists()  # the worker did die after writing
    assert items["d0.0"].status == items["d1.0"].status == "completed"
    assert items["d0.0"].attempts == 1 and items["d0.0"].task == tasks[0]
    starts = [rid for event, _, _, rid in events(log) if event == "start"]
    assert sorted(starts) == ["dying.d0.0.1", "dying.d1.0.1"]  # d0 ran once
    index = (tmp_path / "dying" / "index.jsonl").read_text().splitlines()
    assert len(index) == 2
    forget_left(served, "dying")


def test_past_the_requeue_bound_a_rollout_is_an_infrastructure_error(
    ray_cluster: None, served: Served, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    tasks = [
        {"task_id": "crash", "crash": True, "wait": 2.0, "log": str(log)},
        {"task_id": "ok1", "chat": False},
        {"task_id": "ok2", "chat": False},
    ]
    executor = two_workers(max_requeues=1, max_worker_restarts=4)
    with RolloutClient(
        ProbeAgent, shared_gateway(served), store=str(tmp_path), exp_id="bound", executor=executor
    ) as client:
        items = {i.result.rollout_key: i.result for i in client.run_batch(tasks)}
        # Per-call overrides travel to the worker with the rollout.
        after = client.invoke({"task_id": "after"}, temperature=0.25, max_tokens=3).result(60)
    crash = items["crash.0"]
    assert (crash.status, crash.error_kind, crash.attempts) == ("error", "infrastructure", 2)
    assert "Ray worker died 2 times" in crash.reason
    assert sum(1 for row in events(log) if row[0] == "start") == 2  # the bound held
    assert {items["ok1.0"].status, items["ok2.0"].status} <= ENDED
    assert after.status in ENDED
    store = store_from_uri(str(tmp_path), "bound")
    stored = store.get("crash.0")
    assert stored is not None and stored.reason == crash.reason
    (turn,) = store.get(after.rollout_key).trajectory.turns
    assert (turn.sampling["temperature"], turn.sampling["max_tokens"]) == (0.25, 3)
    assert len(turn.completion_ids) <= 3
    forget_left(served, "bound")


def test_the_cap_and_the_rate_limit_hold_across_the_cluster(
    ray_cluster: None, served: Served, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    tasks = [{"task_id": f"c{i}", "wait": 0.8, "chat": False, "log": str(log)} for i in range(10)]
    with RolloutClient(
        ProbeAgent, shared_gateway(served), store=str(tmp_path), executor=two_workers(),
        max_concurrent=3, tps_limit=4,
    ) as client:  # fmt: skip
        assert all(i.success for i in client.run_batch(tasks))
    rows = events(log)
    assert len({pid for *_, pid, _ in rows}) == 2  # both workers ran rollouts
    assert peak_concurrency(rows) == 3
    # 4 starts a second, spaced evenly; one more for a message Ray delivered late.
    starts = sorted(at for event, at, _, _ in rows if event == "start")
    assert max(sum(1 for s in starts if t <= s < t + 1.0) for t in starts) <= 5
    assert starts[-1] - starts[0] >= 2.0


def test_rollouts_dispatched_together_share_ray_calls_and_each_ends_once(
    ray_cluster: None, served: Served, tmp_path: Path
) -> None:
    """Ray's state per call dominated the driver's memory per rollout in flight: rollouts
    dispatched together go to a worker in one call, each streamed back on its own."""
    tasks = [{"task_id": f"s{i}", "chat": False, "wait": 0.01 * (i % 7)} for i in range(120)]
    executor = two_workers()
    with RolloutClient(
        ProbeAgent, shared_gateway(served), store=str(tmp_path), executor=executor,
    ) as client:  # fmt: skip
        items = list(client.run_batch(tasks))
    assert sorted(i.index for i in items) == list(range(120))
    assert all(i.success and i.result.attempts == 1 for i in items)
    load = executor.load()
    assert sum(w["dispatched"] for w in load) == 120
    assert sum(w["ray_calls"] for w in load) <= 60  # one each before


def test_timeout_and_cancel_reach_rollouts_on_workers(
    ray_cluster: None, served: Served, tmp_path: Path
) -> None:
    with RolloutClient(
        ProbeAgent, shared_gateway(served), store=str(tmp_path), executor=two_workers(),
        timeout=1.0,
    ) as client:  # fmt: skip
        timed_out = client.invoke({"task_id": "slow", "wait": 30})
        cancelled = client.invoke({"task_id": "hang", "wait": 30})
        cancelled.cancel()
        assert cancelled.result(timeout=30).status == "cancelled"
        record = timed_out.result(timeout=30)
    assert record.status == "timeout" and "1" in record.reason
    assert cancelled.result().reason


def test_rollouts_on_workers_are_heard_starting_and_finishing(
    ray_cluster: None, served: Served, tmp_path: Path
) -> None:
    heard: list[RolloutEvent] = []
    tasks = [{"task_id": f"e{i}", "chat": False, "reward": 0.5 * i} for i in range(2)]
    with RolloutClient(
        ProbeAgent, shared_gateway(served), store=str(tmp_path), executor=two_workers(),
        on_event=heard.append,
    ) as client:  # fmt: skip
        records = [item.result for item in client.run_batch(tasks)]
    for record in records:
        mine = [e for e in heard if e.rollout_id == record.rollout_id]
        assert [e.kind for e in mine] == ["rollout_started", "reward", "rollout_finished"]
        assert mine[1].to_dict()["reward"] == record.reward
        assert mine[2].to_dict()["status"] == record.status == "completed"


def test_workers_share_one_gateway(ray_cluster: None, served: Served, tmp_path: Path) -> None:
    shared = RemoteGateway(served.url, admin_key=served.admin_key)
    tasks = [{"task_id": f"s{i}"} for i in range(3)]
    with RolloutClient(
        ProbeAgent, shared, store=str(tmp_path), exp_id="shared", executor=two_workers(),
        max_tokens=4, seed=2,
    ) as client:  # fmt: skip
        items = list(client.run_batch(tasks, group_size=2))
        again = list(client.run_batch(tasks, group_size=2))  # resumes: nothing runs again
    assert len(items) == 6 and all(i.result.status in ENDED for i in items)
    assert all(i.from_store and i.result.trajectory is None for i in again)
    assert sorted(i.result.trajectory_stats.turns for i in again) == [1] * 6
    assert len((tmp_path / "shared" / "index.jsonl").read_text().splitlines()) == 6
    for record in store_from_uri(str(tmp_path), "shared").records():
        (turn,) = record.trajectory.turns
        assert record.trajectory.samples[0].response_ids[-len(turn.completion_ids) :] == (
            turn.completion_ids
        )
    assert not [r for r in served.gateway._rollouts if r.startswith("shared.")]


def test_a_program_agent_runs_in_a_sandbox_on_a_worker(ray_cluster: None, tmp_path: Path) -> None:
    program = tmp_path / "ask.py"
    program.write_text(
        "import openai\n"
        "reply = openai.OpenAI().chat.completions.create(model='m', max_tokens=4,\n"
        "    messages=[{'role': 'user', 'content': 'Say hi.'}])\n"
        "print(reply.choices[0].message.content)\n"
    )
    agent = ProgramAgent(f"{sys.executable} {program}")
    with RolloutClient(
        agent, "embedded", store=str(tmp_path), exp_id="prog", executor=one_worker(), seed=4
    ) as client:
        items = list(client.run_batch([{"task_id": "p0"}, {"task_id": "p1"}]))
    assert all(i.result.status in ENDED for i in items) and len(items) == 2
    for record in store_from_uri(str(tmp_path), "prog").records():
        (turn,) = record.trajectory.turns
        assert 0 < len(turn.completion_ids) <= 4
        assert record.trajectory.samples[0].logprobs[-len(turn.logprobs) :] == turn.logprobs


def test_an_agent_server_reports_back_to_the_worker_that_runs_its_rollout(
    ray_cluster: None, agent_server, tmp_path: Path
) -> None:
    server = agent_server()
    tasks = [{"task_id": f"r{i}", "chats": 1, "reward": float(i)} for i in range(4)]
    with RolloutClient(
        server.url, "embedded", agent_key=KEY, store=str(tmp_path / "reports"),
        executor=two_workers(), max_tokens=4,
    ) as client:  # fmt: skip
        items = list(client.run_batch(tasks))
    assert sorted(i.result.reward for i in items) == [0.0, 1.0, 2.0, 3.0]
    assert all(i.result.trajectory_stats.turns == 1 for i in items)
    assert server.service.runs_started == 4
    assert {s.callback for s in server.service._runs.values()} == {"delivered"}


def test_everything_sent_to_workers_survives_pickling(
    ray_cluster: None, served: Served, agent_server, s3_env: str, tmp_path: Path
) -> None:
    """Agents (a file-loaded class, a program in a sandbox, an agent server), a file-loaded
    reward function, a shared gateway and an S3 store reach a fresh worker process intact."""
    from rollway.executors.base import WorkerConfig
    from rollway.executors.ray_workers import check_shippable
    from rollway.gateway.engine_choice import EngineChoice
    from rollway.rollouts import RolloutConfig, RolloutLimits
    from rollway.sandbox import sandbox_factory

    calculator = load_agent(CALCULATOR)()
    reward = import_target("examples/calculator/agent.py").reward  # type: ignore[attr-defined]
    setup = WorkerConfig(
        agent=calculator,
        engine=EngineChoice.of(RemoteGateway(served.url, admin_key=served.admin_key)),
        store=store_from_uri(s3_env, "pickled"),
        settings=RolloutConfig.build(
            "pickled", sampling={"seed": 3}, limits=RolloutLimits(timeout=9.0)
        ),
        reward=reward,
    )
    check_shippable(setup, ray)
    program = ProgramAgent("python agent.py", sandbox=sandbox_factory("namespace"))
    server = agent_server()
    remote = resolve_agent(server.url, KEY)
    # The worker runs with the environment Ray started with: no AWS_* variables.
    assert "AWS_ENDPOINT_URL" not in ray.get(_env_names.remote())

    seen = ray.get(_inspect.remote(setup, program, remote))
    assert seen["agent"] == ("calculator", ["add", "divide", "multiply", "subtract"])
    assert seen["module_by_value"] is True
    assert seen["reward"] == {"reward": 1.0, "final": "25"}
    assert seen["store"] == ("pickled", False)  # an S3 HEAD from the worker, no env needed
    assert seen["gateway"] == (served.url, served.gateway.model_name, {}, None)
    assert seen["settings"] == ({"seed": 3}, 9.0)
    assert seen["program"] == (program.command, "NamespaceSandbox")
    assert seen["remote"] == (server.url, None)


@ray.remote
def _env_names() -> list[str]:
    return list(os.environ)


@ray.remote
def _inspect(setup, program, remote) -> dict:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    agent = setup.agent
    tools = sorted(t["function"]["name"] for t in agent.get_tools({}))
    messages = [{"role": "assistant", "content": "25"}]
    trajectory = SimpleNamespace(messages=messages)
    return {
        "agent": (agent.name, tools),
        # The agent's file was never imported here: its class came by value.
        "module_by_value": type(agent).__module__ not in sys.modules,
        "reward": setup.reward({"answer": 25}, trajectory),
        "store": (setup.store.exp_id, setup.store.exists("nothing-here")),
        "gateway": (
            setup.engine.shared.url,
            setup.engine.shared.model_name,
            setup.engine.shared._keys,
            setup.engine.shared._session,
        ),
        "settings": (setup.settings.fixed_sampling(), setup.settings.limits.timeout),
        "program": (program.command, program.make_sandbox.__name__),
        "remote": (remote.url, remote._settings),
    }


def test_a_worker_that_cannot_start_fails_the_client_with_its_reason(
    ray_cluster: None, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"failed to start: .*unknown engine spec 'nope'"):
        RolloutClient(ProbeAgent, "nope", store=str(tmp_path), executor=two_workers())


def test_engine_objects_are_refused_for_ray_by_name(renderer: ChatRenderer, tmp_path) -> None:
    from rollway.engines.sim import SimEngine

    gateway = Gateway(SimEngine(), renderer, model_name="sim")
    with pytest.raises(ConfigError, match="engine spec"):
        RolloutClient(ProbeAgent, gateway, store=str(tmp_path), executor=RayExecutor())


def test_without_ray_installed_the_error_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    imports = [sys.executable, "-c", "import sys, rollway; print('ray' in sys.modules)"]
    assert subprocess.run(imports, capture_output=True, text=True).stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "ray", None)  # what an absent package looks like
    with pytest.raises(ConfigError, match=r"pip install 'rollway\[ray\]'"):
        RolloutClient(ProbeAgent, "sim", store=str(tmp_path), executor="ray")
    with pytest.raises(ConfigError, match="unknown executor 'dask'"):
        RolloutClient(ProbeAgent, "sim", store=str(tmp_path), executor="dask")


@pytest.mark.parametrize(
    ("placement", "workers", "per_node"),
    [(["--workers", "1"], 1, None), (["--workers-per-node", "2"], 2, 2)],
)
def test_rollway_run_on_a_ray_cluster_from_the_command_line(
    ray_cluster: None, tmp_path: Path, placement: list[str], workers: int, per_node: int | None
) -> None:
    root = Path(__file__).resolve().parents[2]
    address = ray.get_runtime_context().gcs_address  # the cluster this module started
    run = subprocess.run(
        [sys.executable, "-m", "rollway", "run", f"{root}/{CALCULATOR}",
         "--tasks", str(root / "examples/calculator/tasks.jsonl"), "--limit", "2",
         "--group-size", "2", "--max-tokens", "8", "--seed", "1", "--out", str(tmp_path),
         "--executor", "ray", "--ray-address", address, *placement],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    exp = tmp_path / "calculator-tasks"
    config = orjson.loads((exp / "config.json").read_bytes())
    # Not the cluster's 4 CPUs: one worker, or two on its one node.
    assert (config["executor"], config["workers"]) == ("ray", workers)
    assert config["workers_per_node"] == per_node
    records = list(store_from_uri(str(tmp_path), "calculator-tasks").records())
    assert len(records) == 4 and all(r.trajectory and r.trajectory.turns for r in records)
    assert orjson.loads((exp / "summary.json").read_bytes())["total"] == 4
    assert "rollway run summary" in run.stderr


def test_the_ray_options_go_with_the_ray_executor(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-m", "rollway", "run", f"{root}/{CALCULATOR}",
         "--tasks", str(root / "examples/calculator/tasks.jsonl"), "--workers", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0 and "--executor ray" in run.stderr


def test_every_worker_takes_a_weight_update_and_a_sglang_spec_is_refused(
    ray_cluster: None, tmp_path: Path
) -> None:
    executor = two_workers()
    with RolloutClient(
        ProbeAgent, "sim://?output_len=3", store=str(tmp_path), executor=executor
    ) as client:
        assert client.policy_version == 0
        update = client.update_weights({"w": [1.0]}, mode="drain")
        assert update["policy_version"] == 1 == client.policy_version
        workers = [w.actor for w in executor._workers]
        assert [p.version for p in ray.get([w.policy.remote() for w in workers])] == [
            1,
            1,
        ]
        items = list(client.run_batch([{"task_id": f"v{i}"} for i in range(4)]))
    assert {i.result.policy_version for i in items} == {1}
    assert all(w["dispatched"] >= 1 for w in executor.load())  # both workers stamped 1

    # Each worker's engine would send the same update to the same servers.
    with (
        RolloutClient(
            ProbeAgent, "sglang://127.0.0.1:9", store=str(tmp_path), executor=one_worker()
        ) as shared_servers,
        pytest.raises(ConfigError, match="through a shared gateway"),
    ):
        shared_servers.update_weights("/ckpt")
