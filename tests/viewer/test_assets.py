"""The pages ship inside the package: every asset is package data (a wheel carries it), and no
page or script loads anything from another host (no CDN: the viewer works offline)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from rollway.viewer.viewer_app import ASSETS

ROOT = Path(__file__).resolve().parents[2]


def test_every_asset_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["rollway.viewer"]
    files = [p.relative_to(ASSETS.parent).as_posix() for p in ASSETS.rglob("*") if p.is_file()]
    assert len(files) >= 6
    assert [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []


def test_no_asset_reaches_for_another_host() -> None:
    for path in ASSETS.iterdir():
        text = path.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), path.name
        assert not re.search(r"(fetch|import)\(\s*[\"'`](https?:)?//", text), path.name
        assert "@import" not in text, path.name
