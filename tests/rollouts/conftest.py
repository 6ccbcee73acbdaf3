"""The client fixtures, for tests of rollouts run by a client (judges)."""

from tests.client.conftest import make_client, reset_scripted_agent

__all__ = ["make_client", "reset_scripted_agent"]
