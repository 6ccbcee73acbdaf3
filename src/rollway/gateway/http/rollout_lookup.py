"""Which rollout a turn belongs to. On a rollout's own base URL (``/v1/rollouts/{id}/...``) the
path says it and the key must be the rollout's. On the gateway's shared routes
(``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses`` at the root: one base URL for
every rollout, as clients that know one URL use it) the rollout is found from

1. the rollout's own key as the bearer token (or ``x-api-key``), as agentcore-rl-toolkit's
   gateway finds its session; else
2. an ``X-Session-ID`` header (verifiers' clients send one), with the gateway's session key
   or admin key, where the operator turned sessions on (``rollway gateway --sessions``):
   ``known`` takes only a session registered as a rollout of that id, ``open`` also
   registers one on first use with the gateway's defaults.

Anything else is refused (401, saying how to name the rollout): calls of many rollouts on one
URL are never merged into one rollout."""

from __future__ import annotations

import logging
from enum import StrEnum

from starlette.requests import Request

from rollway.errors import AuthError, UnknownRolloutError
from rollway.gateway.core import Gateway
from rollway.gateway.http.app_state import gateway_of
from rollway.gateway.request_schema import RegisterRequest
from rollway.ids import keys_match
from rollway.web.handlers import SESSION_HEADER, bearer, session_id

log = logging.getLogger(__name__)


class Sessions(StrEnum):
    """What ``X-Session-ID`` may do on the shared routes."""

    OFF = "off"
    KNOWN = "known"
    OPEN = "open"


SHARED_ROUTE_REFUSAL = (
    "this is the gateway's shared route: it serves many rollouts, so a call must say which one "
    "is its own. Send the rollout's key (the api_key its registration answered) as the bearer "
    "token, or use the rollout's base URL (/v1/rollouts/<id>)"
)


def authorized_rollout(request: Request) -> tuple[str, Gateway]:
    """The id of the rollout the call is for, its key checked, and the gateway."""
    gateway = gateway_of(request)
    key = bearer(request)
    rollout_id = request.path_params.get("rollout_id")
    if rollout_id is not None:
        gateway.authorize(rollout_id, key)
        return rollout_id, gateway
    found = gateway.rollout_of_key(key)
    if found is not None:
        return found, gateway
    session = session_id(request)
    if session is None:
        raise AuthError(SHARED_ROUTE_REFUSAL)
    return _session_rollout(request, gateway, session, key), gateway


def _session_rollout(request: Request, gateway: Gateway, session: str, key: str | None) -> str:
    state = request.app.state
    sessions: Sessions = state.sessions
    if sessions is Sessions.OFF:
        raise AuthError(
            f"{SHARED_ROUTE_REFUSAL}; {SESSION_HEADER} {session[:64]!r} names no rollout here: "
            "this gateway takes session ids only with `rollway gateway --sessions known|open`"
        )
    if not (keys_match(key, state.session_key) or keys_match(key, state.admin_key)):
        raise AuthError(f"a call with {SESSION_HEADER} needs the gateway's session key")
    if gateway.is_open(session):
        return session
    if sessions is Sessions.KNOWN:
        raise UnknownRolloutError(
            f"{SESSION_HEADER} {session[:64]!r}: no rollout of that id is registered (register "
            "it first, or start the gateway with --sessions open)"
        )
    gateway.register(session, RegisterRequest(metadata={"session": session}))
    log.info("session opened as a rollout", extra={"rollout_id": session, "stage": "session"})
    return session
