"""The page at `/` as LibreTranslate users know it, in a real headless browser: a files tab (the server says
`filesTranslation: true`), the source language shown for a one-source model, an icon at /favicon.ico."""

from __future__ import annotations

from pathlib import Path

import httpx

from onnxmt import DecodeOptions, Translator
from onnxmt.documents.translate import translate_lines
from tests.helpers.browser import headless_chromium
from tests.helpers.server import Server, server_fixture

# A one-source, one-target model, with the service's defaults.
single = server_fixture("tiny_onnx_dir", log="serve-page")
LINES = ["Good morning!", "", "What is this?"]


def test_favicon_is_served_to_anyone(single: Server) -> None:
    response = httpx.get(f"{single.url}/favicon.ico", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header


def test_page_shows_the_source_and_translates_a_file(single: Server, tiny_onnx_dir: Path, tmp_path: Path) -> None:
    browser = headless_chromium(tmp_path / "profile")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    upload = tmp_path / "notes.txt"
    upload.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    try:
        browser.set_window_size(1000, 800)
        browser.get(f"{single.url}/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: b.find_element(By.ID, "tab-files").is_displayed())
        source = browser.find_element(By.ID, "source")
        assert source.is_displayed()  # one source: shown and chosen, not hidden
        assert Select(source).first_selected_option.get_attribute("value") == "en"
        browser.save_screenshot(str(tmp_path / "page-text.png"))
        browser.find_element(By.ID, "tab-files").click()
        assert browser.find_element(By.ID, "files-pane").is_displayed()
        assert not browser.find_element(By.ID, "text-pane").is_displayed()
        assert ".docx" in browser.find_element(By.ID, "file").get_attribute("accept")
        browser.find_element(By.ID, "file").send_keys(str(upload))
        browser.find_element(By.ID, "translate-file").click()
        wait.until(lambda b: b.find_element(By.ID, "download").is_displayed())
        browser.save_screenshot(str(tmp_path / "page-files.png"))
        link = browser.find_element(By.ID, "download")
        assert link.text == "Download notes.txt" and browser.find_element(By.ID, "error").text == ""
        downloaded = httpx.get(link.get_attribute("href"), timeout=30)
        translator = Translator(tiny_onnx_dir, decoding=DecodeOptions())
        assert downloaded.text == "\n".join(translate_lines(translator, LINES)) + "\n"
        problems = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not problems, problems  # no 404 for the icon, no Content-Security-Policy violation
    finally:
        browser.quit()
