"""The recording gateway: OpenAI-compatible in front, token ids and logprobs underneath."""

from rollway.gateway.core import Gateway
from rollway.gateway.factory import build_gateway
from rollway.gateway.http.gateway_app import create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.generation import ChatResult

__all__ = ["ChatResult", "Gateway", "RemoteGateway", "build_gateway", "create_app"]
