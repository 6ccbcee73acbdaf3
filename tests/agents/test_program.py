"""Program agents: any command, sandboxed, pointed at its rollout's gateway over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

from examples.calculator.agent import check_answer

from rollway.agents.program import ProgramAgent
from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import ChatRenderer, Gateway
from rollway.sandbox import SandboxLimits

ROOT = Path(__file__).resolve().parents[2]
OPENAI_AGENT = [sys.executable, str(ROOT / "examples" / "openai_agent" / "agent.py")]
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
    last = trajectory.turns[-1]
    assert sample.prompt_ids + sample.response_ids == last.prompt_ids + last.completion_ids
    final = trajectory.messages[-1]["content"]
    assert record.reward == (1.0 if check_answer(TASK, final) else 0.0)


def sim_gateway(renderer: ChatRenderer) -> Gateway:
    return Gateway(SimEngine(SimConfig()), renderer, model_name="sim")


def test_a_crashing_program_is_an_agent_error_with_its_stderr(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    crash = script(tmp_path, "import sys; sys.stderr.write('kaboom'); sys.exit(2)")
    record = run_one(sim_gateway(renderer), ProgramAgent(crash), tmp_path)
    assert (record.status, record.error_kind) == ("error", "agent")
    assert "exited with 2" in record.reason and "kaboom" in record.reason


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
