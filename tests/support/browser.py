"""Open a local HTML file in a real headless Chromium and report what a user would have seen.

Driven through Debian's chromium + chromium-driver with selenium. An error
collector is installed before any page script runs (DevTools
`Page.addScriptToEvaluateOnNewDocument`), so uncaught exceptions and
rejected promises from plotly are caught as well as console errors.
Background networking is off: the page must work offline.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
INSTALL_HINT = "apt-get install -y chromium chromium-driver (and pip install selenium)"
REQUIRED = os.environ.get("SERVELAB_REQUIRE_CHROMIUM") == "1"
"""Set by scripts/test (CI): a missing browser is a failure there, not a skip."""

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
)

_ERROR_COLLECTOR = """
window.__pageErrors = [];
window.addEventListener('error', e => window.__pageErrors.push(
  'error: ' + (e.message || e.type) + ' at ' + (e.filename || '') + ':' + (e.lineno || '')));
window.addEventListener('unhandledrejection', e => window.__pageErrors.push(
  'unhandled rejection: ' + String(e.reason)));
const __consoleError = console.error.bind(console);
console.error = (...args) => {
  window.__pageErrors.push('console.error: ' + args.map(String).join(' '));
  __consoleError(...args);
};
"""

_PLOT_STATE = """
return Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
  id: d.id, rendered: d.querySelector('svg.main-svg') !== null, traces: (d.data || []).length,
  title: (d.layout && d.layout.title && d.layout.title.text) || '',
  menu: ((d.layout && d.layout.updatemenus) || []).flatMap(m => (m.buttons || []).map(b => b.label))
}));
"""


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return f"selenium is not installed ({INSTALL_HINT})"
    if not CHROMIUM or not CHROMEDRIVER:
        return f"chromium or chromedriver not found ({INSTALL_HINT})"
    return None


def available() -> bool:
    """Whether a browser check can run; raises where one is required (CI) but cannot."""
    reason = missing()
    if reason and REQUIRED:
        raise RuntimeError(f"SERVELAB_REQUIRE_CHROMIUM=1 but {reason}")
    return reason is None


@dataclass
class PlotState:
    id: str
    rendered: bool
    """The div holds plotly's svg.main-svg: plotly drew it."""
    traces: int
    title: str
    menu: list[str]
    """Labels of the plot's dropdown buttons, as plotly holds them."""


@dataclass
class PageCheck:
    errors: list[str]
    """JavaScript errors, unhandled rejections, console.error calls and SEVERE browser log entries."""
    plots: list[PlotState]
    headings: list[str]
    screenshot: Path
    page_height: int


def open_page(html: Path, screenshot: Path, *, width: int = 1400, timeout_s: float = 60.0) -> PageCheck:
    """Loads `html`, waits until every plot div has rendered (or timeout), and saves a full-page PNG."""
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with tempfile.TemporaryDirectory(prefix="servelab-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(timeout_s)
            driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _ERROR_COLLECTOR})
            driver.get(html.resolve().as_uri())
            try:
                WebDriverWait(driver, timeout_s).until(
                    lambda d: (
                        d.execute_script("return document.readyState") == "complete"
                        and all(p["rendered"] for p in d.execute_script(_PLOT_STATE))
                    )
                )
            except TimeoutException:
                pass  # reported below as plots that did not render
            plots = [PlotState(**p) for p in driver.execute_script(_PLOT_STATE)]
            errors = list(driver.execute_script("return window.__pageErrors || []"))
            errors += [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
            headings = driver.execute_script(
                "return Array.from(document.querySelectorAll('h2')).map(h => h.textContent)"
            )
            metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            height = int(size["height"])
            shot = driver.execute_cdp_cmd(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": int(size["width"]), "height": height, "scale": 1},
                },
            )
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        finally:
            driver.quit()
    return PageCheck(errors=errors, plots=plots, headings=headings, screenshot=screenshot, page_height=height)
