"""A headless chromium driven by selenium (Debian's chromium and chromedriver), for the report's
tests (tests/test_report.py) and timings (docs/report_times.py): no browser is downloaded.

The flags keep chromium off the network (this machine has none: background fetches would be
refused at every start) and in a profile of its own, removed at close.
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
         "--window-size=1280,1300")


def missing() -> list[str]:
    """What a headless chromium needs that this machine lacks."""
    out = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        out.append("selenium")
    return out


@contextmanager
def headless_chromium():
    """A selenium driver of chromium that keeps the page's console (driver.get_log("browser"))."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="spectrace-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
