"""Debian's headless Chromium driven by Selenium, for the tests of the page at `/`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.helpers.skips import importorskip, skip

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def headless_chromium(profile: Path) -> Any:
    """A Chrome webdriver on Debian's chromium, its browser log kept (to see Content-Security-Policy violations);
    skips (fails in CI) without chromium, chromedriver or selenium. The caller quits it."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    webdriver = importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def translation_done(browser: Any) -> bool:
    """The page's translation has finished: its status line is clear and the Translate button enabled again (the
    page streams: text in the result before then may be a part)."""
    from selenium.webdriver.common.by import By

    status, button = browser.find_element(By.ID, "status"), browser.find_element(By.ID, "translate")
    return bool(status.text == "" and button.is_enabled())
