"""Check that a built wheel holds every file of the package: modules and package data.

Usage: python scripts/check_wheel.py dist/rollway-*.whl
       python scripts/check_wheel.py --list-sources   (what a build needs, NUL-separated)

What must be there is every file of ``src/rollway`` that git tracks or would track (those the
working tree still has), so a new asset folder, a sub-package without ``__init__.py`` or a data
file that ``pyproject.toml``'s ``package-data`` does not name fails here, not on a user's
machine.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_files(*paths: str) -> list[str]:
    """Files under ``paths`` that git tracks or would track, and that exist (a moved module's
    old path is still tracked until the move is committed)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    return sorted({name for name in listed if name and (ROOT / name).is_file()})


def package_files() -> set[str]:
    """Every file of the package, as its path inside the wheel."""
    return {name.removeprefix("src/") for name in source_files("src/rollway")}


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def main(wheel: Path) -> int:
    inside = wheel_files(wheel)
    missing = sorted(package_files() - inside)
    if missing:
        print(f"{wheel.name} lacks {len(missing)} package files:", *missing, sep="\n  ")
        return 1
    entry_points = [name for name in inside if name.endswith(".dist-info/entry_points.txt")]
    if not entry_points:
        print(f"{wheel.name} has no entry_points.txt: no `rollway` command")
        return 1
    print(f"{wheel.name}: all {len(package_files())} package files are in it")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--list-sources"]:
        sys.stdout.write("\0".join(source_files("pyproject.toml", "README.md", "src")))
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1])))
