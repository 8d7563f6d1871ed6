"""The live dashboard in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver (nothing downloads a browser), against a running sim job's controller. The page loads,
keeps updating while the run progresses, and its buttons reach the controller.
DASHBOARD_SCREENSHOT=path saves what the browser showed (docs/dashboard.png was taken so)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.live_run import wait_for
from shared.admin_auth import TOKEN_ENV
from tests.live_run import live_run

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [pytest.mark.e2e, pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                 reason="Debian's chromium and chromium-driver are not installed "
                                        "(make system-deps installs them)")]


@pytest.fixture
def browser() -> Iterator[Any]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1300,1150", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: Any, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def updates(driver: Any) -> int:
    return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-updates") or 0)


@pytest.mark.timeout(300)
def test_the_dashboard_updates_while_a_run_progresses_and_its_buttons_reach_the_controller(
        tmp_path: Path, browser: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "browser-token")  # the launcher's services inherit it
    with live_run(tmp_path, time_scale=0.12, policy="default", total_rollout_steps=640) as (job, address):
        browser.get(f"http://{address}/dashboard#token=browser-token")  # the page's buttons send it
        assert "dynsched" in browser.title
        wait_for(lambda: updates(browser) >= 1, timeout_s=30, what="the page's first update", job=job)
        wait_for(lambda: text_of(browser, "versions").startswith("v2"), timeout_s=120,
                 what="the page to show weight version 2", job=job)
        seen = updates(browser)
        wait_for(lambda: text_of(browser, "versions").startswith("v3") and updates(browser) > seen,
                 timeout_s=120, what="the page to follow the run to version 3", job=job)
        assert text_of(browser, "mode") in ("standalone_only", "hybrid_active", "activating", "deactivating")
        rows = browser.execute_script("return document.getElementById('timeline').height")
        assert rows >= 5 * 26, "the resource-time chart has a row per replica and the trainer"

        browser.find_element(By.ID, "activate").click()
        wait_for(lambda: "activate requested" in text_of(browser, "message"), timeout_s=20,
                 what="the controller's answer to Activate", job=job)
        Select(browser.find_element(By.ID, "policy-name")).select_by_value("fixed_ratio")
        ratio = browser.find_element(By.ID, "policy-ratio")
        ratio.clear()
        ratio.send_keys("0.4")
        browser.find_element(By.ID, "policy-apply").click()
        policy = wait_for(lambda: (p := httpx.get(f"http://{address}/policy", timeout=5).json())["name"]
                          == "fixed_ratio" and p, timeout_s=20, what="PUT /policy from the page", job=job)
        assert policy["deactivate_ratio"] == pytest.approx(0.4)
        if screenshot := os.environ.get("DASHBOARD_SCREENSHOT"):
            wait_for(lambda: text_of(browser, "versions").startswith("v5"), timeout_s=120,
                     what="a few more versions for the screenshot", job=job)
            browser.save_screenshot(screenshot)
