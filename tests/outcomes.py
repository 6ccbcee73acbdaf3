"""Outcomes the tests share."""

from __future__ import annotations

#: A rollout that ran to its end: ``truncated`` when its last answer was cut at ``max_tokens``
#: (the simulated engines' short answers often are), ``completed`` otherwise.
ENDED = frozenset({"completed", "truncated"})
