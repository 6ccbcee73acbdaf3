"""`rollway view` as a real subprocess: it prints the URL of the port it got, and serves the
run's listing there until stopped; a path that is no run is one `error:` line."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from rollway.store import FileStore
from tests.viewer.test_listing_scale import small_record

ROOT = Path(__file__).resolve().parents[2]


def test_view_prints_its_url_and_serves_the_run(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "exp")
    for i in range(1, 4):
        store.write(small_record(i))
    command = [sys.executable, "-m", "rollway", "view", str(store.path), "--port", "0",
               "--no-open"]  # fmt: skip
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as view:  # fmt: skip
        try:
            assert view.stdout is not None
            line = view.stdout.readline()
            assert line.startswith("rollway view: exp on http://127.0.0.1:"), line
            url = line.split(" on ", 1)[1].strip()
            listing = httpx.get(f"{url}api/rollouts", params={"sort": "reward"}, timeout=30)
            assert [r["reward"] for r in listing.json()["rows"]] == [0.0, 0.5, 1.0]
            assert "listing.js" in httpx.get(url, timeout=30).text
        finally:
            view.send_signal(signal.SIGINT)
            view.wait(timeout=30)
    assert view.returncode in (0, 130)


def test_view_of_a_folder_that_is_no_run_says_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rollway", "view", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert "error:" in done.stderr and "not an experiment folder" in done.stderr
