"""The Dagster UI of a running `lens demo`, driven in headless Chromium (Debian's chromium and
chromedriver, Selenium from PyPI): the asset graph shows the collectors and their lineage to
`cluster_overview_cache` and `safe_node_statistic`, and one cluster's partition of `gpu_nodes`
materialized from the UI launches a run that succeeds.

CI installs chromium and chromium-driver; there this test must not skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_pipeline_tests.conftest import skip_unless

pytestmark = pytest.mark.slow
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
STARTUP_TIMEOUT = 180.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def graphql(base: str, query: str) -> dict:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]


def _partitions(base: str) -> list[str]:
    node = graphql(
        base, '{ assetNodeOrError(assetKey: {path: ["gpu_nodes"]}) { ... on AssetNode { partitionKeys } } }'
    )
    return node["assetNodeOrError"].get("partitionKeys") or []


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[str]:
    skip_unless(bool(CHROMIUM and CHROMEDRIVER), "Debian's chromium and chromium-driver are not installed")
    pytest.importorskip("selenium", reason="selenium is in the test extras")
    port = _free_port()
    state = tmp_path_factory.mktemp("demo")
    lens = Path(sys.executable).with_name("lens")
    command = [str(lens), "demo", "--clusters", "2", "--nodes", "8", "--port", str(port)]
    command += ["--api-port", "0", "--ingest-port", "0", "--state-dir", str(state), "--churn", "0"]
    log = (state / "demo.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            assert process.poll() is None, (state / "demo.log").read_text()[-3000:]
            try:
                if len(_partitions(base)) == 2:  # the registry sensor added both clusters
                    break
            except (OSError, KeyError, TypeError, ValueError):
                pass
            assert time.monotonic() < deadline, (state / "demo.log").read_text()[-3000:]
            time.sleep(2)
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(demo):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """Waits and retries around a React page that re-renders under the driver's feet."""

    def __init__(self, driver) -> None:
        from selenium.common.exceptions import (
            ElementClickInterceptedException,
            ElementNotInteractableException,
            StaleElementReferenceException,
        )
        from selenium.webdriver.common.by import By

        self.driver, self.by = driver, By
        self.transient = (
            StaleElementReferenceException,
            ElementClickInterceptedException,
            ElementNotInteractableException,
        )

    def text(self) -> str:
        try:
            return self.driver.find_element(self.by.TAG_NAME, "body").text
        except self.transient:
            return ""

    def wait_for_text(self, *wanted: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if all(w in text for w in wanted):
                return text
            assert time.monotonic() < deadline, f"{wanted} not on the page: {text[:2000]}"
            time.sleep(0.5)

    def click(self, xpath: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                shown = [e for e in self.driver.find_elements(self.by.XPATH, xpath) if e.is_displayed()]
                if shown:
                    shown[0].click()
                    return
            except self.transient:
                pass
            assert time.monotonic() < deadline, f"nothing to click at {xpath}"
            time.sleep(0.3)

    def present(self, xpath: str) -> bool:
        return bool(self.driver.find_elements(self.by.XPATH, xpath))


def test_asset_graph_shows_the_lineage_from_the_collectors(demo, browser):
    page = Page(browser)
    browser.get(f"{demo}/assets/cluster_overview_cache?view=lineage")
    page.wait_for_text("collectors", "cluster_views", "gpu_nodes", "gpu_devices", "storage_backends")
    browser.get(f"{demo}/assets/safe_node_statistic?view=lineage")
    page.wait_for_text("safe_node_statistic", "gpu_nodes")
    browser.get(f"{demo}/assets/gpu_nodes?view=lineage")
    page.wait_for_text("Downstream", "cluster_overview_cache")


def test_a_cluster_partition_materialized_from_the_ui_succeeds(demo, browser):
    page = Page(browser)
    clusters = sorted(_partitions(demo))
    chosen, other = clusters
    browser.get(f"{demo}/assets/gpu_nodes")
    dialog = "//*[@role='dialog']"
    deadline = time.monotonic() + 90
    while not page.present(f"{dialog}//button[normalize-space(.)='Custom']"):
        assert time.monotonic() < deadline, "the Materialize button opened no launch dialog"
        page.click("//button[starts-with(normalize-space(.), 'Materialize')]")
        time.sleep(1)
    page.click(f"{dialog}//button[normalize-space(.)='Custom']")
    page.click(f"{dialog}//*[@data-tooltip='{other}']//*[@aria-label='close']/..")  # keep one cluster
    page.wait_for_text("Launch 1 run")
    page.click(f"{dialog}//button[normalize-space(.)='Launch 1 run']")
    toast = page.wait_for_text("Launched run")
    prefix = toast.split("Launched run", 1)[1].split()[0]

    deadline = time.monotonic() + 240
    while True:
        runs = graphql(
            demo,
            "{ runsOrError(limit: 100) { ... on Runs { results { runId status "
            "tags { key value } assetSelection { path } } } } }",
        )["runsOrError"]["results"]
        (run,) = [r for r in runs if r["runId"].startswith(prefix)]
        tags = {t["key"]: t["value"] for t in run["tags"]}
        assert tags.get("dagster/partition") == chosen and run["assetSelection"] == [{"path": ["gpu_nodes"]}]
        if run["status"] == "SUCCESS":
            break
        assert run["status"] not in ("FAILURE", "CANCELED"), run
        assert time.monotonic() < deadline, f"run {run['runId']} still {run['status']}"
        time.sleep(2)
    browser.get(f"{demo}/runs/{run['runId']}")
    page.wait_for_text("Success")
