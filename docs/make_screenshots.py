"""Screenshots of `rollway view` for the README and docs/observability.md: the
listing, and one rollout's page.

    python docs/make_screenshots.py rollway-runs/calculator-tasks

serves the viewer over the run on loopback and has headless Chromium (Debian's ``chromium``)
take ``docs/images/viewer.png`` (the listing: reward by policy version, rollouts with their
advantages, groups) and ``docs/images/viewer-rollout.png`` (the rollout with the most turns:
its group, its conversation segment by segment, its turns). The docs' pair came from a folded
run, which shows every segment:

    rollway run examples/long_context/agent.py:LogReaderAgent \
        --tasks examples/long_context/tasks.jsonl --group-size 2 \
        --engine "embedded://?context_length=512" --record-entropy
    python docs/make_screenshots.py rollway-runs/log-reader-tasks
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from rollway.viewer import create_viewer_app, open_run
from rollway.web.background_server import BackgroundServer

DOCS = Path(__file__).resolve().parent


def screenshot(chromium: str, url: str, path: Path, size: tuple[int, int]) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--virtual-time-budget=15000",
             f"--window-size={size[0]},{size[1]}", f"--screenshot={path}", url],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", default="rollway-runs/calculator-tasks")
    parser.add_argument("--out", type=Path, default=DOCS / "images")
    parser.add_argument("--rollout", help="the rollout key to show (default: most turns)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("needs Debian's chromium: apt-get install chromium", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with BackgroundServer(create_viewer_app(open_run(args.run))) as url:
        key = args.rollout
        if key is None:
            page = httpx.get(f"{url}/api/rollouts", params={"sort": "turns", "order": "desc"})
            key = page.json()["rows"][0]["key"]
        screenshot(chromium, f"{url}/", args.out / "viewer.png", (1400, 1000))
        screenshot(chromium, f"{url}/rollouts/{key}", args.out / "viewer-rollout.png",
                   (1400, 1900))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
