"""A screenshot of a live `rollway run` for docs/observability.md: the terminal
halfway through a batch.

    python docs/make_live_screenshot.py

runs the main job (the calculator agent, embedded model) with more rollouts than ``make run``
in a pseudo-terminal, reads the terminal the way a terminal would (``pyte``, the ``docs``
extra), and when half the rollouts are done renders the screen to HTML and has headless
Chromium take ``docs/images/live-run.png``. The run then goes on to the end.
"""

from __future__ import annotations

import argparse
import html
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyte

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
COLUMNS, LINES = 110, 30
#: The bar's "done/total" column.
DONE_OF_TOTAL = re.compile(r"rollouts .*? (\d+)/(\d+)")
#: pyte's names for the basic colours, as a dark terminal theme shows them.
PALETTE = {
    "default": "#d4d4d4", "black": "#3c3c3c", "red": "#f14c4c", "green": "#23d18b",
    "brown": "#e5e510", "yellow": "#e5e510", "blue": "#3b8eea", "magenta": "#d670d6",
    "cyan": "#29b8db", "white": "#e5e5e5", "brightblack": "#808080",
}  # fmt: skip


def run_until_half(command: list[str], timeout_s: float) -> pyte.Screen:
    """Run ``command`` in a pseudo-terminal; return the screen once half the rollouts are done
    and a status line has been printed (the run is left to finish)."""
    screen = pyte.Screen(COLUMNS, LINES)
    stream = pyte.ByteStream(screen)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the run, in a terminal of our size
        os.environ.update(COLUMNS=str(COLUMNS), LINES=str(LINES), TERM="xterm-256color")
        os.execvp(command[0], command)
    deadline = time.monotonic() + timeout_s
    captured: pyte.Screen | None = None
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal: it has ended
                break
            if not data:
                break
            stream.feed(data)
            if captured is None and _half_done(screen):
                captured = _copy(screen)
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    if captured is None:
        raise SystemExit("the run ended (or timed out) before half its rollouts were done")
    return captured


def _half_done(screen: pyte.Screen) -> bool:
    text = "\n".join(screen.display)
    found = DONE_OF_TOTAL.search(text)
    return bool(found) and "status" in text and 2 * int(found[1]) >= int(found[2]) > 0


def _copy(screen: pyte.Screen) -> pyte.Screen:
    copy = pyte.Screen(screen.columns, screen.lines)
    for y in range(screen.lines):
        for x in range(screen.columns):
            copy.buffer[y][x] = screen.buffer[y][x]
    return copy


def to_html(screen: pyte.Screen) -> str:
    rows = []
    for y in range(screen.lines):
        cells = []
        for x in range(screen.columns):
            char = screen.buffer[y][x]
            color = PALETTE.get(char.fg, f"#{char.fg}" if len(char.fg) == 6 else PALETTE["default"])
            weight = "bold" if char.bold else "normal"
            cells.append(
                f'<span style="color:{color};font-weight:{weight}">{html.escape(char.data)}</span>'
            )
        rows.append("".join(cells))
    body = "\n".join(rows).rstrip()
    return (
        "<!doctype html><meta charset=utf-8><body style='margin:0;background:#1e1e1e'>"
        "<pre style=\"margin:0;padding:14px;font:14px/1.35 'DejaVu Sans Mono',monospace;"
        f'color:{PALETTE["default"]}">{body}</pre>'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS / "images" / "live-run.png")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    rollway = str(Path(sys.executable).with_name("rollway"))
    with tempfile.TemporaryDirectory() as work:
        command = [
            rollway, "run", "examples/calculator/agent.py:CalculatorAgent",
            "--tasks", "examples/calculator/tasks.jsonl", "--limit", str(args.limit),
            "--group-size", str(args.group_size), "--status-interval", "2",
            "--out", f"{work}/runs",
        ]  # fmt: skip
        os.chdir(ROOT)
        screen = run_until_half(command, args.timeout)
        page = Path(work) / "live-run.html"
        page.write_text(to_html(screen), encoding="utf-8")
        height = 28 + round(14 * 1.35 * (_last_used_line(screen) + 1))
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={work}/profile", f"--window-size=1000,{height}",
             f"--screenshot={args.out}", page.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    print(f"wrote {args.out}")
    return 0


def _last_used_line(screen: pyte.Screen) -> int:
    used = [y for y, line in enumerate(screen.display) if line.strip()]
    return used[-1] if used else 0


if __name__ == "__main__":
    raise SystemExit(main())
