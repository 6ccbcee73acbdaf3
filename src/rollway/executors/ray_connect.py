"""How the Ray executor's driver joins its cluster, and what a failure to join says.

A cluster with token authentication (Ray >= 2.52) refuses a driver without its token. Against
``HOST:PORT``, ``ray.init`` retries that refusal once a second for 20 s, logging a line each
time, then raises a ``ConnectionError`` that names only the address ("Failed to connect to Ray
cluster at ..."); Ray's own ``AuthenticationError`` is inside it, as the cause's last line. So
one direct try at the cluster's GCS comes first: a refusal fails at once, naming the token."""

from __future__ import annotations

import queue
import re
import threading
from typing import Any

from rollway.errors import ConfigError
from rollway.executors.ray_workers import ray_cause

#: A GCS address, which ``ray.init`` connects to directly (``ray://`` goes through Ray Client,
#: ``auto`` and ``local`` find or start a cluster on this machine).
_GCS_ADDRESS = re.compile(r"(\[[0-9a-fA-F:.]+\]|[\w.-]+):\d+")
#: How long the direct try may take: a cluster that answers does in milliseconds; one that
#: does not is left to ``ray.init``, which waits for it as it always has.
PROBE_S = 3.0


def join_cluster(ray: Any, address: str, user_address: str | None, options: Any) -> None:
    """``ray.init`` on ``address``, any failure a ``ConfigError`` that says why."""
    try:
        refuse_a_missing_token(address)
        ray.init(address=address, **options)
    except Exception as exc:
        raise ray_start_error(exc, user_address) from exc


def refuse_a_missing_token(address: str) -> None:
    """Raise Ray's ``AuthenticationError`` if the cluster at ``address`` refuses this process's
    token (or its lack of one). The try runs on a thread of its own: an address that does not
    answer holds it for Ray's own connect timeout, and is ``ray.init``'s to report."""
    if not _GCS_ADDRESS.fullmatch(address):
        return
    from ray import _raylet
    from ray.exceptions import AuthenticationError

    # Ray's own client of its GCS, not public: in another Ray's layout, ray.init's failure is
    # classified as it comes.
    gcs_client = getattr(_raylet, "GcsClient", None)
    if gcs_client is None:
        return
    answers: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

    def try_once() -> None:
        try:
            gcs_client(address=address)
        except BaseException as exc:
            answers.put(exc)
        else:
            answers.put(None)

    threading.Thread(target=try_once, name="rollway-ray-token-check", daemon=True).start()
    try:
        answer = answers.get(timeout=PROBE_S)
    except queue.Empty:
        return
    if isinstance(answer, AuthenticationError):
        raise answer


def ray_start_error(exc: BaseException, address: str | None) -> ConfigError:
    """Why joining Ray failed, its ``param`` saying what about, for the hint (``cli.failures``):
    ``ray_auth`` when Ray's ``AuthenticationError`` (or its words) is anywhere in the chain of
    causes, else ``ray_address``."""
    where = address or "RAY_ADDRESS, or a new local instance"
    refused = _refusal(exc)
    # Ray's own advice on tokens follows its words: the hint gives rollway's.
    cause = ray_cause(refused or exc).split(" Ensure that the token")[0]
    param = "ray_auth" if refused else "ray_address"
    return ConfigError(f"cannot start Ray ({where}): {cause}", param)


def _refusal(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that says the cluster wants a token, if one does."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        said = f"{type(current).__name__} {current}".lower()
        if "authenticationerror" in said or ("auth" in said and "token" in said):
            return current
        current = current.__cause__ or current.__context__
    return None
