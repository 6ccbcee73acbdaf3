"""Program agents: any command, sandboxed, pointed at its rollout's gateway over HTTP."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from examples.calculator.agent import check_answer

from rollway.agents.program import ProgramAgent
from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.logs import KeyValueFormatter
from rollway.sandbox import LocalSandbox, NamespaceSandbox, SandboxLimits
from rollway.trajectory_format import whole_prompts

ROOT = Path(__file__).resolve().parents[2]
OPENAI_AGENT = [sys.executable, str(ROOT / "examples" / "openai_agent" / "agent.py")]
AGENTS_SDK_AGENT = [sys.executable, str(ROOT / "examples" / "openai_agents_sdk" / "agent.py")]
TASK = {"task_id": "p1", "question": "What is 11 + 14?", "answer": 25}


def run_one(gateway: Gateway, agent: ProgramAgent, tmp_path: Path, **kw: object):
    with RolloutClient(agent, gateway, store=str(tmp_path), **kw) as client:
        (item,) = client.run_batch([TASK])
    return item.result


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "prog.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_an_openai_sdk_program_is_recorded_token_exactly(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    record = run_one(gateway, ProgramAgent(OPENAI_AGENT), tmp_path, seed=1)
    assert record.status == "completed", record.reason
    trajectory = record.trajectory
    assert 1 <= len(trajectory.turns) <= 4  # the script's loop makes at most 4 calls
    (sample,) = trajectory.samples
    last = len(trajectory.turns) - 1
    whole = trajectory.prompt_ids(last) + trajectory.turns[last].completion_ids
    assert sample.prompt_ids + sample.response_ids == whole
    final = trajectory.messages[-1]["content"]
    assert record.reward == (1.0 if check_answer(TASK, final) else 0.0)


def test_an_openai_agents_sdk_program_runs_unmodified_over_the_responses_route(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    record = run_one(gateway, ProgramAgent(AGENTS_SDK_AGENT), tmp_path, seed=1)
    assert record.status == "completed", record.reason
    trajectory = record.trajectory
    assert 1 <= len(trajectory.turns) <= 4  # Runner.run(max_turns=4)
    # The SDK's instructions and the worked example reached the model as chat messages.
    prompt = renderer.tokenizer.decode(trajectory.prompt_ids(0))
    assert "Use the tools to compute" in prompt and "What is 3 + 4?" in prompt
    assert "What is 11 + 14?" in prompt
    for sample in trajectory.samples:
        sampled = [i for i, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        turns = [t for t in trajectory.turns if t.segment == sample.segment]
        assert sampled == [i for t in turns for i in t.completion_ids]
    final = trajectory.turns[-1].content or ""
    assert record.reward == (1.0 if check_answer(TASK, final) else 0.0)


def sim_gateway(renderer: ChatRenderer) -> Gateway:
    return Gateway(SimEngine(SimConfig()), renderer, model_name="sim")


def test_each_stage_of_a_program_rollout_is_a_log_line_with_its_rollout_id(
    renderer: ChatRenderer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    quiet = script(tmp_path, "print('done')")
    with caplog.at_level(logging.DEBUG, logger="rollway"):
        record = run_one(sim_gateway(renderer), ProgramAgent(quiet), tmp_path)
    stages = [
        (r.stage, r.rollout_id)
        for r in caplog.records
        if getattr(r, "stage", None) and getattr(r, "rollout_id", None) == record.rollout_id
    ]
    assert [s for s, _ in stages] == [
        "register", "create_sandbox", "start_agent", "wait", "teardown", "complete",
        "fetch_trajectory", "finish",
    ]  # fmt: skip
    line = KeyValueFormatter().format(next(r for r in caplog.records if r.stage == "wait"))
    assert f"rollout_id={record.rollout_id} stage=wait exit_code=0 timed_out=False" in line
    created = next(r for r in caplog.records if getattr(r, "stage", None) == "create_sandbox")
    assert f"stage=create_sandbox sandbox={LocalSandbox.__name__}" in KeyValueFormatter().format(
        created
    )  # the sandbox's own type, not the agent's


def test_the_run_summary_counts_what_a_program_agent_sampled(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    with RolloutClient(ProgramAgent(OPENAI_AGENT), sim_gateway(renderer), store=str(tmp_path)) as c:
        (item,) = c.run_batch([TASK])
        summary = c.last_summary
    assert item.result.status == "completed"
    sampled = sum(len(t.completion_ids) for t in item.result.trajectory.turns)
    assert sampled > 0 and summary is not None
    assert summary["tokens_per_s"] == pytest.approx(sampled / summary["wall_s"])


def test_a_program_agents_record_takes_its_metrics_and_messages_from_the_recorded_turns(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    three_calls = script(
        tmp_path,
        "import json, os\n"
        "from openai import OpenAI\n"
        "client, messages = OpenAI(), [{'role': 'user', 'content': 'hi'}]\n"
        "for _ in range(3):\n"
        "    reply = client.chat.completions.create(\n"
        "        model=os.environ['OPENAI_MODEL'], messages=messages, max_tokens=8)\n"
        "    answer = {'role': 'assistant', 'content': reply.choices[0].message.content}\n"
        "    messages += [answer, {'role': 'user', 'content': 'more'}]\n"
        "json.dump({'finish_reason': 'max_steps'}, open(os.environ['ROLLWAY_RESULT_FILE'], 'w'))\n",
    )
    record = run_one(sim_gateway(renderer), ProgramAgent(three_calls), tmp_path)
    # Its last answer was cut at 8 tokens: truncated, and the reason the program gave is kept.
    assert record.status == "truncated" and record.finish_reason == "max_steps"
    trajectory = record.trajectory
    turns, metrics = trajectory.turns, record.metrics
    assert metrics.llm_calls == len(turns) == 3
    prompts = [prompt for _, prompt in whole_prompts(turns)]
    assert metrics.prompt_tokens == sum(len(prompt) for prompt in prompts) > 0
    assert metrics.response_tokens == sum(len(t.completion_ids) for t in turns) > 0
    assert metrics.max_context == len(prompts[-1]) + len(turns[-1].completion_ids)
    assert metrics.llm_latency_ms == pytest.approx(sum(t.latency_ms for t in turns))
    assert 0 < metrics.llm_latency_ms < metrics.total_latency_ms
    # The last request (user, then assistant and user twice) and the gateway's reply.
    assert record.messages == trajectory.messages and len(record.messages) == 6
    failed = run_one(sim_gateway(renderer), ProgramAgent(script(tmp_path, "1/0")), tmp_path / "f")
    assert (failed.status, failed.finish_reason) == ("error", "error")


def test_in_a_namespace_sandbox_the_gateway_is_the_only_way_out(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    agent = ProgramAgent(OPENAI_AGENT, sandbox=NamespaceSandbox)
    record = run_one(sim_gateway(renderer), agent, tmp_path)
    assert record.status == "completed", record.reason
    assert record.trajectory is not None and len(record.trajectory.turns) >= 1


def test_a_crashing_program_is_an_agent_error_with_its_stderr(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    crash = script(tmp_path, "import sys; sys.stderr.write('kaboom'); sys.exit(2)")
    record = run_one(sim_gateway(renderer), ProgramAgent(crash), tmp_path)
    assert (record.status, record.error_kind) == ("error", "agent")
    assert "exited with 2" in record.reason and "kaboom" in record.reason


def test_a_program_that_exits_on_an_engine_failure_is_an_engine_error(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    """The program sees a 502 and gives up: the engine failed, not the agent, so the rollout
    is an engine error (retried, rerun by resume), not an agent error."""

    class DeadEngine(SimEngine):
        async def generate(self, input_ids, sampling, request_id):  # type: ignore[override]
            raise ConnectionResetError("server went away mid-generation")

    record = run_one(
        Gateway(DeadEngine(), renderer, model_name="sim"), ProgramAgent(OPENAI_AGENT), tmp_path,
        max_retry_attempts=1,
    )  # fmt: skip
    assert (record.status, record.error_kind) == ("error", "engine"), record.reason
    assert "server went away" in record.reason
    assert "server went away" in record.trajectory.engine_errors[0]


def test_a_program_that_never_calls_the_model_still_gets_one_outcome(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    quiet = script(
        tmp_path,
        "import json, os\n"
        "task = json.load(open(os.environ['ROLLWAY_TASK_FILE']))\n"
        "json.dump({'reward': 0.5}, open(os.environ['ROLLWAY_RESULT_FILE'], 'w'))\n",
    )
    record = run_one(sim_gateway(renderer), ProgramAgent(quiet), tmp_path)
    assert record.status == "completed" and record.reward == 0.5
    assert record.trajectory.turns == []


class BrokenTeardown(LocalSandbox):
    """Tears down, then raises, as a sandbox whose cleanup hits a busy mount might."""

    async def destroy(self) -> None:
        await super().destroy()
        raise OSError("device or resource busy")


def test_a_sandbox_whose_teardown_raises_keeps_the_outcome_and_records_the_error(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    good = script(
        tmp_path,
        "import json, os\n"
        "json.dump({'reward': 0.5}, open(os.environ['ROLLWAY_RESULT_FILE'], 'w'))\n",
    )
    agent = ProgramAgent(good, sandbox=BrokenTeardown)
    record = run_one(sim_gateway(renderer), agent, tmp_path)
    assert (record.status, record.reward) == ("completed", 0.5), record.reason
    assert record.trajectory is not None
    assert record.cleanup_errors == ["teardown: OSError: device or resource busy"]
    crash = ProgramAgent(script(tmp_path, "import sys; sys.exit(3)"), sandbox=BrokenTeardown)
    record = run_one(sim_gateway(renderer), crash, tmp_path / "crash")
    assert (record.status, record.error_kind) == ("error", "agent")
    assert "exited with 3" in (record.reason or "") and len(record.cleanup_errors) == 1


def test_a_hanging_program_is_killed_and_torn_down(renderer: ChatRenderer, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    hang = script(
        tmp_path,
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n",
    )
    agent = ProgramAgent(hang, limits=SandboxLimits(wall_timeout_s=60))
    record = run_one(sim_gateway(renderer), agent, tmp_path, timeout=1.0)
    assert record.status == "timeout"
    pid = int(pid_file.read_text())
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_the_program_sees_its_rollout_endpoint_and_task(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    probe = script(
        tmp_path,
        "import json, os, sys\n"
        "from openai import OpenAI\n"
        "stdin_task = json.load(sys.stdin)\n"
        "reply = OpenAI().chat.completions.create(model=os.environ['OPENAI_MODEL'],\n"
        "    messages=[{'role': 'user', 'content': stdin_task['question']}])\n"
        "rollout = os.environ['ROLLWAY_ROLLOUT_ID']\n"
        "ok = os.environ['OPENAI_BASE_URL'].endswith('/v1/rollouts/' + rollout)\n"
        "json.dump({'reward': 1.0 if ok and reply.choices else 0.0},\n"
        "          open(os.environ['ROLLWAY_RESULT_FILE'], 'w'))\n",
    )
    record = run_one(sim_gateway(renderer), ProgramAgent(probe), tmp_path)
    assert record.status == "completed" and record.reward == 1.0
    assert len(record.trajectory.turns) == 1


def test_a_relative_program_path_keeps_its_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A venv's bin/python is a symlink: followed, it is the base interpreter without the
    # venv's packages.
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    agent = ProgramAgent("venv/bin/python prog.py")
    assert agent.command == [str(tmp_path / "venv" / "bin" / "python"), "prog.py"]


def test_a_word_too_long_to_name_a_file_stays_an_argument() -> None:
    # An inline program whose words pass NAME_MAX: is_file() raised and aborted the run.
    code = "print(1)#" + "x" * 300
    assert ProgramAgent(f"python3 -c '{code}'").command == ["python3", "-c", code]


# Leaves its result file as the task says: a FIFO, a link, more than the limit, some text, its
# folder swapped for a link, or a reward.
# Inline: a namespace sandbox does not see the host's /tmp, where tmp_path is.
LEAVES = [
    sys.executable,
    "-c",
    """
import json, os, sys
task, path = json.load(sys.stdin), os.environ["ROLLWAY_RESULT_FILE"]
if task["leave"] == "fifo":
    os.mkfifo(path)
elif task["leave"] == "link":
    os.symlink(task["target"], path)
elif task["leave"] == "big":
    json.dump({"reward": 1.0, "pad": "x" * 4 * 1024 * 1024}, open(path, "w"))
elif task["leave"] == "text":
    open(path, "w").write(task["text"])
elif task["leave"] == "swap":  # its folder moved aside, a link to the victim's in its place
    json.dump({"reward": 0.0}, open(path, "w"))
    folder = os.path.dirname(path)
    try:
        os.rename(folder, folder + ".moved")
        os.symlink(task["victim"], folder)
    except OSError:  # a mount point in the namespace sandbox: it cannot be moved
        pass
else:
    json.dump({"reward": 0.5}, open(path, "w"))
""",
]


def run_tasks(agent: ProgramAgent, renderer: ChatRenderer, tmp_path: Path, tasks: list[dict]):
    with RolloutClient(agent, sim_gateway(renderer), store=str(tmp_path), timeout=60) as client:
        return {tasks[item.index]["task_id"]: item.result for item in client.run_batch(tasks)}


# Before, the client's event loop blocked for good opening the FIFO: bounded by killing the run.
@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("sandbox", [LocalSandbox, NamespaceSandbox])
def test_a_result_file_that_is_a_fifo_is_an_agent_error_and_the_batch_goes_on(
    renderer: ChatRenderer, tmp_path: Path, sandbox: type[LocalSandbox]
) -> None:
    agent = ProgramAgent(LEAVES, sandbox=sandbox)
    tasks = [{"task_id": "fifo", "leave": "fifo"}]
    tasks += [{"task_id": f"good{i}", "leave": "reward"} for i in range(3)]
    results = run_tasks(agent, renderer, tmp_path, tasks)
    fifo = results.pop("fifo")
    assert (fifo.status, fifo.error_kind) == ("error", "agent")
    assert "result file" in fifo.reason and "is a FIFO, not a regular file" in fifo.reason
    assert [(r.status, r.reward) for r in results.values()] == [("completed", 0.5)] * 3


@pytest.mark.parametrize("sandbox", [LocalSandbox, NamespaceSandbox])
def test_a_result_file_that_is_a_link_is_not_followed(
    renderer: ChatRenderer, tmp_path: Path, sandbox: type[LocalSandbox]
) -> None:
    """A link to /dev/zero had the client read until it was killed; this one leads to a file
    that the client would read (and reward) if it followed it."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"reward": 1.0}')
    agent = ProgramAgent(LEAVES, sandbox=sandbox)
    task = {"task_id": "link", "leave": "link", "target": str(elsewhere)}
    (record,) = run_tasks(agent, renderer, tmp_path, [task]).values()
    assert (record.status, record.error_kind) == ("error", "agent")
    assert "result file" in record.reason and "is a symbolic link" in record.reason


def test_a_result_file_over_its_limit_is_an_agent_error_naming_the_limit(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    agent = ProgramAgent(LEAVES)  # the default limits: 4 MiB
    (record,) = run_tasks(agent, renderer, tmp_path, [{"task_id": "b", "leave": "big"}]).values()
    assert (record.status, record.error_kind) == ("error", "agent")
    assert "over its limit of 4194304 bytes (SandboxLimits.result_bytes)" in record.reason


def test_the_rollout_timeout_holds_while_the_result_file_is_read(
    renderer: ChatRenderer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that stalls (a file system that hangs) still ends at the rollout's timeout."""
    release = threading.Event()

    def stalls(*args: object) -> dict[str, object]:
        release.wait(60)
        return {}

    monkeypatch.setattr("rollway.agents.program._read_result", stalls)
    agent = ProgramAgent(LEAVES)
    started = time.monotonic()
    try:
        record = run_one(sim_gateway(renderer), agent, tmp_path, timeout=2.0)
    finally:
        release.set()
    # On the event loop, the read held everything up for its whole 60 s.
    assert record.status == "timeout" and time.monotonic() - started < 30


@pytest.mark.parametrize("sandbox", [LocalSandbox, NamespaceSandbox])
def test_a_program_that_swaps_its_folder_for_a_link_gets_its_own_result_and_leaves_nothing(
    renderer: ChatRenderer, tmp_path: Path, sandbox: type[LocalSandbox]
) -> None:
    """Local sandbox: the client read the victim's result.json (its reward recorded as the
    program's), the supervisor wrote its exit status into the victim's folder, and the link
    outlived the run."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "result.json").write_text('{"reward": 1.0}')
    agent = ProgramAgent(LEAVES, sandbox=sandbox)
    task = {"task_id": "swap", "leave": "swap", "victim": str(victim)}
    (record,) = run_tasks(agent, renderer, tmp_path / "runs", [task]).values()
    assert (record.status, record.reward) == ("completed", 0.0), record.reason
    assert sorted(p.name for p in victim.iterdir()) == ["result.json"]
    temp = Path(tempfile.gettempdir())
    links = [p for p in temp.glob("rollway-sandbox-*") if p.is_symlink()]
    assert all(os.readlink(link) != str(victim) for link in links)


# A result file that is there but not a JSON object of the documented shape: before, the first
# three were ignored (completed, no reward), the rest errors of their own kinds.
NOT_RESULTS = {
    "empty": ("", "is not JSON"),
    "not json": ("reward: 1", "is not JSON"),
    "a list": ("[1.0]", "holds a JSON list, not an object"),
    "a long number": ("1" + "0" * 100_000, "an integer of 100001 digits, over 300"),
    "nan": ('{"reward": NaN}', "has reward NaN: a finite number or null"),
    "infinite": ('{"reward": 1e400}', "has reward Infinity: a finite number or null"),
    "a string reward": ('{"reward": "1.0"}', 'has reward "1.0": a finite number or null'),
    "a boolean reward": ('{"reward": true}', "has reward true: a finite number or null"),
    "a number reason": ('{"finish_reason": 3}', "has finish_reason 3: a string or null"),
    "deep": ("[" * 100_000 + "]" * 100_000, "is nested too deeply"),
}


def test_a_result_file_that_is_not_a_result_object_is_an_agent_error_saying_why(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    tasks = [{"task_id": name, "leave": "text", "text": t} for name, (t, _) in NOT_RESULTS.items()]
    ok = '{"reward": 0.5, "finish_reason": null, "notes": [1, 2]}'  # other keys are its own
    tasks.append({"task_id": "ok", "leave": "text", "text": ok})
    results = run_tasks(ProgramAgent(LEAVES), renderer, tmp_path, tasks)
    good = results.pop("ok")
    assert (good.status, good.reward, good.finish_reason) == ("completed", 0.5, "stop")
    for name, record in results.items():
        assert (record.status, record.error_kind) == ("error", "agent"), name
        assert "the program's result file /" in record.reason, name
        assert NOT_RESULTS[name][1] in record.reason, (name, record.reason)
