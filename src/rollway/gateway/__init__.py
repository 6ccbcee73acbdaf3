"""The recording gateway: OpenAI-compatible in front, token ids and logprobs underneath."""

from rollway.gateway.app import create_app
from rollway.gateway.chat_template import ChatRenderer
from rollway.gateway.core import ChatResult, Gateway, Registration
from rollway.gateway.factory import build_gateway
from rollway.gateway.server import BackgroundServer

__all__ = [
    "BackgroundServer",
    "ChatRenderer",
    "ChatResult",
    "Gateway",
    "Registration",
    "build_gateway",
    "create_app",
]
