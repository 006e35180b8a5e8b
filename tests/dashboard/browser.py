"""A real headless Chromium for the tests that walk the demo's pages, and the helpers they share."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

from tests.tools import require_tool

GPULENS = [sys.executable, "-m", "gpulens.cli"]


def start_demo(*args: str) -> tuple[subprocess.Popen, list[str]]:
    """Start `gpulens demo`; return it and the lines it printed up to and including the URL line."""
    process = subprocess.Popen([*GPULENS, "demo", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("http://"):
            return process, lines
    raise AssertionError(f"no URL line; printed {lines!r}, stderr {process.stderr.read()!r}")


def stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=30)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def chromium(profile: str, width: int = 1400, height: int = 2400) -> Iterator:
    """Yield one headless Chromium of that window size, logging its network requests; quit it after."""
    binary = require_tool("chromium", "Debian package 'chromium'")
    driver_path = require_tool("chromedriver", "Debian package 'chromium-driver'")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    # Every request the pages make, read back with get_log("performance") (chromedriver's DevTools events).
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shown(browser, url: str, *texts: str, timeout: float = 60) -> str:
    """Open `url` and return the page's text once every one of `texts` is on it: Streamlit draws over its
    websocket after the page loads, and the demo's nodes settle over their first minute."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    body = browser.find_element(By.TAG_NAME, "body")
    try:
        WebDriverWait(browser, timeout).until(lambda _: all(text in body.text for text in texts))
    except TimeoutException:
        page = body.text
        missing = [text for text in texts if text not in page]
        raise AssertionError(f"{url} did not show {missing} within {timeout:g} s; it showed:\n{page[:4000]}") from None
    return body.text


def sidebar(browser) -> list[str]:
    """The labels of the sidebar's page links (without their icons' ligature names)."""
    return browser.execute_script(
        "return [...document.querySelectorAll('[data-testid=stSidebarNavLink] [data-testid=stMarkdownContainer]')]"
        ".map(label => label.innerText)"
    )
