"""Without Chromium the browser tests skip on a developer's machine, and fail under CI."""

from __future__ import annotations

import shutil

import pytest

from tests.viewer.conftest import find_chromium


@pytest.fixture
def no_chromium(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)


@pytest.mark.usefixtures("no_chromium")
def test_missing_chromium_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        find_chromium()


@pytest.mark.usefixtures("no_chromium")
def test_missing_chromium_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        find_chromium()


def test_a_chromium_on_the_path_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert find_chromium() == "/usr/bin/chromium"
