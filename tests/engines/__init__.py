"""Engine tests. Simulated servers count what they received by the id on the wire; SGLang's
ends in ``~`` (``engines.remote.sglang_wire.wire_rid``), so tests compare ``by_request_id``
views."""

from __future__ import annotations

from typing import Any


def by_request_id(stats: dict[str, Any]) -> dict[str, Any]:
    """A simulated server's stats with wire rids turned back into rollway request ids."""
    ids = lambda rids: [r.removesuffix("~") for r in rids]  # noqa: E731
    return {
        **stats,
        "generations": {k.removesuffix("~"): n for k, n in stats["generations"].items()},
        "aborted": ids(stats["aborted"]),
        "in_flight": ids(stats["in_flight"]),
    }
