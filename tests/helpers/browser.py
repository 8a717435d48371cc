"""Debian's Chromium driven by Playwright, for the tests of the web bundle's page: the executable
(found, or installed with apt where the tests run as root), Playwright and a browser, once a module."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.npm import NPM_CACHE, exclusive


@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's executable: found, or installed with apt where this runs as root."""
    pytest.importorskip("playwright.sync_api")
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and shutil.which("apt-get") and Path("/").stat().st_uid == 0:
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        with exclusive(NPM_CACHE / ".apt-lock"):  # one apt at a time across test workers
            for step in (["install"], ["update"], ["install"]):  # the package lists, where the first try lacks them
                if shutil.which("chromium") is not None:
                    break
                subprocess.run(["apt-get", *step, "-y", "-q", *(["chromium"] if step == ["install"] else [])],
                               capture_output=True, timeout=900)  # fmt: skip
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("Chromium is not installed and apt could not install it")
    return found


@pytest.fixture(scope="module")
def driver(chromium):
    """Playwright, once for the module (its sync API runs one at a time)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(chromium, driver):
    launched = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    yield launched
    launched.close()
