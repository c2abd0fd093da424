"""``explore dashboard``: optuna-dashboard on a study's storage, live.

Its errors (no such study, optuna-dashboard not installed, a port in use) are exit
status 2 with the reason; it serves our ``journal://`` storage as well as SQLite, and
Ctrl-C ends it with 130 and no traceback.  In Chromium (Debian's package, driven
headless by Selenium), the dashboard of a study that a driver is running shows the
running trials and a running trial's record with its planned bytes; the screenshot is
kept in ``$EXPLORE_TEST_ARTIFACTS`` (default ``build/test-artifacts/``).  Chromium,
chromedriver and selenium missing fail that test in CI and skip it elsewhere.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from click.testing import CliRunner

from explore.cli import main
from explore.storages import connect, release
from explore.study import RECORD_ATTR
from tests.conftest import _unavailable
from tests.explore.drivers import (
    descendants,
    grid_space,
    pids_alive,
    running_trials,
    start,
)

ROOT = Path(__file__).resolve().parents[2]
CHROMEDRIVER = "/usr/bin/chromedriver"  # Debian's chromium-driver, when not on the PATH
RECORD = {"driver": "vm:1:abc", "host": "vm", "pid": 1, "device": "cpu",
          "planned_bytes": {"forward": 28160, "gradient": 13376, "optimizer": 7424,
                            "workspace": 28672},
          "total_bytes": 77632, "batch_size": 32, "worker": 0, "arena_offset": 0}


def artifacts() -> Path:
    """Where tests keep what a person looks at afterwards (git ignores build/)."""
    return Path(os.environ.get("EXPLORE_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))


def _dashboard_installed() -> None:
    if importlib.util.find_spec("optuna_dashboard") is None:
        _unavailable('optuna-dashboard (the dev extra: pip install -e ".[dev]") is not '
                     "installed")


def browser() -> tuple[str, str]:
    """Chromium and its driver (and selenium, optuna-dashboard): what is missing fails
    the test in CI and skips it elsewhere, saying how to install it."""
    missing = []
    for module, package in (("selenium", "selenium"), ("optuna_dashboard", "optuna-dashboard")):
        if importlib.util.find_spec(module) is None:
            missing.append(f'{package} (the dev extra: pip install -e ".[dev]")')
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or (CHROMEDRIVER if os.access(CHROMEDRIVER, os.X_OK)
                                              else None)
    if chromium is None:
        missing.append("chromium (Debian/Ubuntu: apt-get install chromium)")
    if driver is None:
        missing.append("chromedriver (Debian/Ubuntu: apt-get install chromium-driver)")
    if missing:
        _unavailable("no " + ", ".join(missing))
    assert chromium is not None and driver is not None
    return chromium, driver


def make_study(storage: str, name: str = "s") -> int:
    """A study with one complete trial and one running trial holding a record; the
    running trial's number."""
    opened = connect(storage, write=True)
    try:
        study = optuna.create_study(study_name=name, storage=opened, direction="maximize")
        study.add_trial(optuna.trial.create_trial(value=0.5, user_attrs={RECORD_ATTR: RECORD}))
        running = study.ask()
        running.set_user_attr(RECORD_ATTR, RECORD)
        return running.number
    finally:
        release(opened)


# -- errors --------------------------------------------------------------------------
def test_an_unknown_study_names_the_storage_and_the_studies_there(tmp_path: Path) -> None:
    _dashboard_installed()
    db = tmp_path / "s.db"
    make_study(f"sqlite:///{db}", "mine")
    result = CliRunner().invoke(main, ["dashboard", "--storage", str(db), "--study", "other"])
    assert result.exit_code == 2, result.output
    assert "no study 'other'" in result.output and str(db) in result.output
    assert "studies there: 'mine'" in result.output
    missing = tmp_path / "none.db"  # looked at, not created
    result = CliRunner().invoke(main, ["dashboard", "--storage", str(missing), "--study", "s"])
    assert result.exit_code == 2 and "none.db" in result.output and not missing.exists()
    result = CliRunner().invoke(main, ["dashboard", "--storage", str(db)])
    assert result.exit_code == 2 and "give SPACE_FILE, or both --storage and --study" \
        in result.output


def test_without_optuna_dashboard_it_says_how_to_install_it(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # import raises ImportError
    db = tmp_path / "s.db"
    make_study(f"sqlite:///{db}")
    result = CliRunner().invoke(main, ["dashboard", "--storage", str(db), "--study", "s"])
    assert result.exit_code == 2, result.output
    assert 'optuna-dashboard is not installed' in result.output
    assert 'pip install -e ".[dashboard]"' in result.output
    assert "Traceback" not in result.output


def test_a_port_in_use_is_an_error(tmp_path: Path) -> None:
    _dashboard_installed()
    db = tmp_path / "s.db"
    make_study(f"sqlite:///{db}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["dashboard", "--storage", str(db), "--study", "s",
                                           "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert "give another --port" in result.output


# -- serving --------------------------------------------------------------------------
class Dashboard:
    """``explore dashboard ARGS --port 0`` in a process (and a process group) of its
    own; its output collected by a thread, its URL read from the first line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "explore.cli", "dashboard", *args, "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # as a terminal starts it: a test run launched in the background (`cmd &`
            # from a script) ignores SIGINT, and the child would inherit that
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def url(self, timeout: float = 60) -> str:
        """The study's page, once the dashboard announced it and answers there."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = [w for line in self.lines for w in line.split() if w.startswith("http://")]
            if found:
                with urllib.request.urlopen(found[0], timeout=10) as r:
                    assert r.status == 200
                return found[0]
            assert self.proc.poll() is None, f"the dashboard ended: {self.output}"
            time.sleep(0.1)
        raise AssertionError(f"no URL within {timeout} s: {self.output}")

    def api(self, url: str) -> dict[str, Any]:
        """The study as optuna-dashboard's page reads it."""
        base, study_id = url.split("/dashboard/studies/")
        with urllib.request.urlopen(f"{base}/api/studies/{study_id}", timeout=10) as r:
            return dict(json.load(r))

    def interrupt(self, timeout: float = 30) -> int:
        """Ctrl-C, as a terminal sends it; the exit status."""
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.mark.parametrize("scheme", ["sqlite", pytest.param("journal", marks=pytest.mark.slow)])
def test_it_serves_the_study_and_ctrl_c_ends_it(tmp_path: Path, scheme: str) -> None:
    """The running trial with its record, from SQLite and from our journal plugin
    (which optuna-dashboard cannot open by URL); Ctrl-C: 130, no traceback."""
    _dashboard_installed()
    storage = f"sqlite:///{tmp_path / 's.db'}" if scheme == "sqlite" else \
        f"journal:///{tmp_path / 's.log'}"
    number = make_study(storage)
    dash = Dashboard("--storage", storage, "--study", "s")
    try:
        url = dash.url()
        assert f"dashboard of study 's' in {storage}: {url}" in dash.output
        got = {t["number"]: t for t in dash.api(url)["trials"]}
        assert got[number]["state"] == "Running"
        attrs = {a["key"]: a["value"] for a in got[number]["user_attrs"]}
        assert json.loads(attrs[RECORD_ATTR])["total_bytes"] == RECORD["total_bytes"]
        code = dash.interrupt()
    finally:
        dash.kill()
    assert code == 130, dash.output
    assert "dashboard stopped" in dash.output and "Traceback" not in dash.output


def test_no_browser_fails_in_ci_and_skips_elsewhere(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Chromium or its driver is missing the browser test says so and how to
    install them: it fails when $CI is set (it must run there) and skips elsewhere."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium, no chromedriver
    monkeypatch.setattr(sys.modules[__name__], "CHROMEDRIVER", str(tmp_path / "chromedriver"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception,
                       match=r"no .*chromium \(Debian/Ubuntu: apt-get install chromium\).*"
                             r"apt-get install chromium-driver.*CI is set"):
        browser()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium-driver"):
        browser()


# -- in a browser ---------------------------------------------------------------------
@contextlib.contextmanager
def chromium(binary: str, driver: str, profile: Path) -> Iterator[Any]:
    """Headless Chromium driven by ``driver``; nothing downloaded (the Service names the
    driver, so Selenium Manager is not asked), and every process of it gone after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    service = Service(executable_path=driver)
    browser = webdriver.Chrome(service=service, options=options)

    def close() -> list[int]:
        """Quit; kill what is left after 10 s; what was left."""
        family = [*descendants(service.process.pid), service.process.pid]
        with contextlib.suppress(Exception):
            browser.quit()
        deadline = time.time() + 10
        while pids_alive(family) and time.time() < deadline:
            time.sleep(0.1)
        left = pids_alive(family)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left

    try:
        yield browser
    except BaseException:
        close()
        raise
    left = close()
    assert not left, f"Chromium processes outlived the browser: {left}"


# Scroll the page so that the first text holding arguments[0] is in view; whether found.
SCROLL_TO = """
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walk.nextNode()) {
  const at = walk.currentNode.data.indexOf(arguments[0]);
  if (at < 0) continue;
  const range = document.createRange();
  range.setStart(walk.currentNode, at);
  const box = range.getBoundingClientRect();
  window.scrollTo(window.scrollX + box.left - 100, window.scrollY + box.top - 300);
  return true;
}
return false;
"""


@pytest.mark.slow  # a browser and a run: CI's slow step runs it
def test_the_dashboard_shows_running_trials_and_their_planned_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary, driver = browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager, were it asked: no download
    storage = f"sqlite:///{tmp_path / 'grid.db'}"
    space = grid_space(tmp_path, 6, rounds=5000, workers=2)  # trials of a minute or more
    run = start(space, storage)
    family: list[int] = []
    dash = None
    try:
        placed = running_trials(storage, 2)
        family = descendants(run.pid)
        dash = Dashboard("--storage", storage, "--study", "grid")
        url = dash.url()
        trial = placed[0]
        record = trial.user_attrs[RECORD_ATTR]
        expected = [f'"planned_bytes": {json.dumps(record["planned_bytes"])}',
                    f'"total_bytes": {record["total_bytes"]}',
                    ]
        # its own attributes too, in view without scrolling (explore.live.FLAT)
        rows = [f'bytes_planned {record["total_bytes"]}', f'worker {record["worker"]}']
        assert trial.user_attrs["bytes_planned"] == record["total_bytes"]
        with chromium(binary, driver, tmp_path / "profile") as page:
            page.get(f"{url}/trials?numbers={trial.number}")

            def shown(_: Any) -> bool:
                text = page.find_element(By.TAG_NAME, "body").text
                lines = {" ".join(line.split()) for line in text.splitlines()}
                return "Running" in text and f"Trial {trial.number}" in text and \
                    all(e in text for e in expected) and all(r in lines for r in rows)

            shot, record_shot = artifacts() / "dashboard.png", artifacts() / "dashboard-record.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            try:
                WebDriverWait(page, 60, poll_frequency=0.5).until(shown)
            finally:
                page.save_screenshot(str(shot))
            text = page.find_element(By.TAG_NAME, "body").text
            # The record is one line of JSON, its planned bytes thousands of pixels to the
            # right: the second picture scrolls there.
            assert page.execute_script(SCROLL_TO, '"planned_bytes"')
            page.save_screenshot(str(record_shot))
        assert text.count("Running") >= 2, text[:2000]  # the list: every placed trial
        for png in (shot.read_bytes(), record_shot.read_bytes()):
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000, len(png)
            width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
            assert width >= 800 and height >= 600, (width, height)
        assert dash.interrupt() == 130, dash.output
        assert "Traceback" not in dash.output, dash.output
    finally:
        if dash is not None:
            dash.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    deadline = time.time() + 10
    while pids_alive(family) and time.time() < deadline:
        time.sleep(0.1)
    assert not pids_alive(family), "a worker outlived its driver"
