"""The recording gateway: OpenAI-compatible in front, token ids and logprobs underneath."""

from rollway.gateway.chat_answer import Registration
from rollway.gateway.chat_template import ChatRenderer
from rollway.gateway.core import Gateway
from rollway.gateway.factory import build_gateway
from rollway.gateway.http_app import create_app
from rollway.types import ChatResult
from rollway.web.background_server import BackgroundServer

__all__ = [
    "BackgroundServer",
    "ChatRenderer",
    "ChatResult",
    "Gateway",
    "Registration",
    "build_gateway",
    "create_app",
]
