"""Owner-marked temp folders: what an ended process left is removed, and nothing else (a live
owner's, an unmarked one, another pid namespace's, another user's, a link)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rollway.tempdirs import (
    OWNER_FILE,
    is_abandoned,
    make_owned_tempdir,
    owner_token,
    remove_abandoned_tempdirs,
)


@pytest.fixture(scope="module")
def ended_owner() -> str:
    """The token of a process that has ended (and been reaped)."""
    child = subprocess.Popen(["sleep", "30"])
    token = owner_token(child.pid)
    child.kill()
    child.wait()
    return token


def folder(root: Path, name: str, token: str | None) -> Path:
    path = root / name
    path.mkdir()
    if token is not None:
        (path / OWNER_FILE).write_text(token)
    return path


def test_a_folder_made_here_names_this_process_which_is_alive() -> None:
    made = make_owned_tempdir("rollway-test-")
    try:
        token = (made / OWNER_FILE).read_text()
        assert token == owner_token() and f".{os.getpid()}." in token
        assert not is_abandoned(token)
    finally:
        (made / OWNER_FILE).unlink()
        made.rmdir()


def test_only_marked_folders_of_ended_owners_are_removed(tmp_path: Path, ended_owner: str) -> None:
    namespace, pid, started = owner_token().split(".")
    ended = folder(tmp_path, "rollway-sandbox-ended", ended_owner)
    (ended / "inside").write_text("x")
    reused = folder(tmp_path, "rollway-gw-reused", f"{namespace}.{pid}.{int(started) - 1}")
    kept = [
        folder(tmp_path, "rollway-sandbox-live", owner_token()),
        folder(tmp_path, "rollway-sandbox-unmarked", None),
        folder(tmp_path, "rollway-sandbox-garbage", "not a token"),
        folder(tmp_path, "rollway-sandbox-elsewhere", f"1{namespace}.{pid}.1"),
        folder(tmp_path, "someone-else", ended_owner),
    ]
    assert sorted(remove_abandoned_tempdirs(tmp_path)) == sorted([ended, reused])
    assert not ended.exists() and not reused.exists()
    assert all(path.is_dir() for path in kept)


def test_a_link_is_not_followed(tmp_path: Path, ended_owner: str) -> None:
    target = folder(tmp_path, "target", ended_owner)
    (tmp_path / "rollway-sandbox-link").symlink_to(target)
    assert remove_abandoned_tempdirs(tmp_path) == []
    assert (target / OWNER_FILE).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_another_users_folder_is_kept(tmp_path: Path, ended_owner: str) -> None:
    theirs = folder(tmp_path, "rollway-sandbox-theirs", ended_owner)
    os.chown(theirs, 65534, 65534)
    assert remove_abandoned_tempdirs(tmp_path) == []
    assert theirs.is_dir()
