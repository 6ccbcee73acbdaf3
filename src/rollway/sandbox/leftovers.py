"""What killed clients left behind, removed by the next one that opens: the sandboxes' working
directories and the gateways' socket folders in the temp dir, and empty pids cgroups. Only what
is marked as rollway's and whose owner has ended (``rollway.tempdirs``); never a live client's,
never another user's. The sandboxes' processes need no such help: they end with their client."""

from __future__ import annotations

from pathlib import Path

from rollway.sandbox.cgroup import remove_abandoned_cgroups
from rollway.tempdirs import remove_abandoned_tempdirs


def remove_leftovers() -> list[Path]:
    """Remove what ended clients left; the paths removed."""
    return [*remove_abandoned_tempdirs(), *remove_abandoned_cgroups()]
