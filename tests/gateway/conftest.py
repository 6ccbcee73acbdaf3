"""A gateway over the sim engine served on loopback: fast, for tests of the HTTP boundary."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from rollway.gateway import build_gateway, create_app
from rollway.web.background_server import BackgroundServer
from tests.conftest import Served


@pytest.fixture(scope="session")
def sim_served() -> Iterator[Served]:
    gateway = build_gateway("sim")
    admin_key = f"ak-{secrets.token_hex(8)}"
    app = create_app(gateway, admin_key=admin_key, max_body_bytes=64 * 1024)
    with BackgroundServer(app) as url:
        yield Served(url, admin_key, gateway)
