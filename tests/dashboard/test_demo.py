"""`gpulens demo` and `gpulens dashboard` as a user runs them, and the page in a real headless Chromium."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from tests.dashboard.browser import GPULENS, answers, chromium, shown, sidebar, start_demo, stop
from tests.tools import free_port, require_tool

# The pages as dashboard/app.py declares them: their titles belong in the sidebar, their file names (and the
# main script's, "app"), which a pages/ folder made Streamlit list, do not.
# A page declared hidden (the Report page, reached from a job's links) is not in the sidebar.
DECLARED = re.findall(
    r'st\.Page\(\s*"screens/(\w+)\.py", title="([^"]+)"(?![^)]*\*\*HIDDEN)',
    (pathlib.Path(__file__).parents[2] / "dashboard" / "app.py").read_text(),
)
PAGES = [title for _, title in DECLARED]
FILE_NAMES = {"app", *(name for name, _ in DECLARED)}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for every browser check of the demo."""
    yield from chromium(str(tmp_path_factory.mktemp("chromium") / "profile"))


@pytest.fixture(scope="module")
def demo():
    # The agents read directly, as where Prometheus is not installed (tests/dashboard/test_walkthrough.py
    # walks the demo through Prometheus).
    process, lines = start_demo("--agents", "--port", str(free_port()), "--refresh", "3")
    yield process, lines
    if process.poll() is None:
        stop(process)


@pytest.mark.slow
def test_demo_prints_its_url_on_a_line_of_its_own_and_serves_the_dashboard(demo):
    process, lines = demo
    url = lines[-1]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)
    assert "5 simulated nodes" in lines[0] and "30 days of made-up past jobs" in lines[1]
    assert all(s in lines[0] for s in ("demo", "diagnosis", "faults", "bench8x32", "mig"))
    assert answers(url + "_stcore/health") and answers(url)
    agents = re.findall(r"\((http://127\.0\.0\.1:\d+)/metrics\)", lines[0])
    assert len(agents) == 5 and all(answers(a + "/metrics") for a in agents)


@pytest.mark.slow
def test_the_browser_shows_flagged_gpus_and_their_tips(demo, browser, tmp_path):
    text = shown(browser, demo[1][-1], "Give the idle GPU back", "mig · GPU 2 · 2g.20gb slice")
    screenshot = os.environ.get("GPULENS_SCREENSHOT") or str(tmp_path / "fleet.png")
    browser.save_screenshot(screenshot)
    assert re.search(r"Flagged GPUs \(\d+\)", text)
    assert "demo · GPU 1" in text and "Idle (held, no work)" in text  # bob's notebook, held and idle
    assert "diagnosis · GPU 0" in text and "Find the rank the job hangs on" in text  # the hung collective
    assert "mig · GPU 2 · 2g.20gb slice" in text  # eli's notebook on a MIG slice of the H100, held and idle
    assert "Traceback" not in text
    assert os.path.getsize(screenshot) > 10_000
    assert sidebar(browser) == PAGES


@pytest.mark.slow
@pytest.mark.parametrize(
    ("link", "texts"),
    [
        ("gpu?node=demo&gpu=1", ["GPU 1 on demo: Idle (held, no work)"]),  # the link's GPU, not the first
        ("job?kind=slurm&id=81234", ["slurm job 81234", "Tip: Add DataLoader workers"]),  # carol's starved job
        ("report?kind=slurm&id=81234", ["GPU usage of job 81234", "Download the page (HTML)"]),  # read from ledgers
        ("probes", ["Is each GPU as fast as it should be"]),
        ("alerts", ["Alerts need Prometheus"]),
    ],
    ids=["gpu", "job", "report", "probes", "alerts"],
)
def test_a_deep_link_opens_its_page_with_the_pages_titles_in_the_sidebar(demo, browser, link, texts):
    page = shown(browser, demo[1][-1] + link, *texts, "Data: ")
    assert sidebar(browser) == PAGES, sidebar(browser)
    assert not FILE_NAMES & set(sidebar(browser))
    assert "Traceback" not in page
    assert browser.current_url == demo[1][-1] + link  # the link stays, query and all


@pytest.mark.slow
def test_a_link_to_a_job_that_is_not_running_says_so_and_points_to_its_report(demo, browser):
    page = shown(
        browser, demo[1][-1] + "job?kind=slurm&id=424242", "slurm job 424242 is not running", "Updated", "instead"
    )
    assert "no record of it in the last 7 days" in page
    assert "gpulens report job 424242 --agent http://127.0.0.1:" in page  # the same from a shell
    assert "Open a running job instead" in page and "slurm job 81234" not in page  # no other job in its place
    assert browser.current_url.endswith("job?kind=slurm&id=424242")
    assert sidebar(browser) == PAGES


@pytest.mark.slow
def test_the_pages_ask_nothing_of_any_server_but_the_dashboard(demo, browser):
    # What this page asks, and every page this module opened before it in the same browser.
    shown(browser, demo[1][-1] + "probes", "Is each GPU as fast as it should be")
    icons = browser.execute_script("return [...document.querySelectorAll('link[rel~=icon]')].map(l => l.href)")
    # The tab's icon is inlined: a Material icon there made the browser ask fonts.gstatic.com for it.
    assert icons and all(href.startswith("data:image/svg+xml") for href in icons), icons
    requests = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requests.append(message["params"]["request"]["url"])
        elif message["method"] == "Network.webSocketCreated":
            requests.append(message["params"]["url"])
    web = [url for url in requests if url.startswith(("http://", "https://", "ws://", "wss://"))]
    loopback = (demo[1][-1], demo[1][-1].replace("http://", "ws://", 1))
    assert web and all(url.startswith(loopback) for url in web), sorted(
        u for u in set(web) if not u.startswith(loopback)
    )


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_and_every_child(demo):
    process, lines = demo
    agents = re.findall(r"\((http://127\.0\.0\.1:\d+)/metrics\)", lines[0])
    assert stop(process) == 0
    assert not any(answers(a + "/metrics") for a in agents)
    assert not answers(lines[-1] + "_stcore/health")
    assert "Traceback" not in process.stderr.read()


@pytest.mark.slow
def test_sigterm_while_the_demo_starts_stops_every_child_it_started():
    """The default action of SIGTERM (a service manager, `kill`) ended the demo and left its agents running."""
    import psutil

    process = subprocess.Popen([*GPULENS, "demo", "--agents", "--port", str(free_port())], stderr=subprocess.PIPE)
    me = psutil.Process(process.pid)
    deadline = time.monotonic() + 120
    started: list[psutil.Process] = []
    while not started and time.monotonic() < deadline and process.poll() is None:
        started = me.children(recursive=True)
        time.sleep(0.05)
    assert started, "the demo started no child"
    process.terminate()
    assert process.wait(timeout=60) == 130
    gone, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    assert "Traceback" not in process.stderr.read().decode()


@pytest.mark.slow
def test_demo_with_prometheus_points_the_dashboard_at_it():
    require_tool("prometheus")
    process, lines = start_demo("--port", str(free_port()), "--prometheus")
    try:
        prometheus = re.search(r"Prometheus at (http://127\.0\.0\.1:\d+) ", "\n".join(lines)).group(1)
        assert answers(prometheus + "/-/ready") and answers(lines[-1] + "_stcore/health")
        nodes = [f'"instance":"{node}"' for node in ("demo", "diagnosis", "faults", "bench8x32", "mig")]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # Prometheus discovers its targets shortly after it is ready
            with urllib.request.urlopen(prometheus + "/api/v1/targets", timeout=5) as response:
                targets = response.read().decode()
            if all(node in targets for node in nodes):
                break
            time.sleep(0.5)
        assert all(node in targets for node in nodes), targets
        assert "with rules: alerts.rules.yml" in "\n".join(lines)
        require_tool("prometheus-alertmanager", "Debian package 'prometheus-alertmanager'")
        alertmanager = re.search(r"Alertmanager at (http://127\.0\.0\.1:\d+) ", "\n".join(lines)).group(1)
        assert answers(alertmanager + "/-/ready")
        with urllib.request.urlopen(prometheus + "/api/v1/alertmanagers", timeout=5) as response:
            assert alertmanager.removeprefix("http://") in response.read().decode()
        # A store stopped, to see what the dashboard says without it: the demo goes on.
        import psutil

        started = psutil.Process(process.pid).children(recursive=True)
        store = next(p for p in started if pathlib.Path(p.cmdline()[0]).name == "prometheus")
        store.terminate()
        store.wait(timeout=30)
        time.sleep(1.0)  # the demo looks every 0.3 s
        assert process.poll() is None and answers(lines[-1] + "_stcore/health")
    finally:
        assert stop(process) == 0
    assert "gpulens: prometheus exited with status 0; the rest go on without it" in process.stderr.read()


@pytest.mark.slow
def test_demo_with_victoriametrics_points_the_dashboard_at_it():
    for tool in ("victoria-metrics", "vmagent", "vmalert"):
        require_tool(tool, "Debian package 'victoria-metrics'")
    process, lines = start_demo("--port", str(free_port()), "--victoriametrics")
    try:
        store = re.search(r"VictoriaMetrics at (http://127\.0\.0\.1:\d+): 2 vmagents", "\n".join(lines)).group(1)
        assert answers(store + "/health") and answers(lines[-1] + "_stcore/health")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the vmagents' first scrapes reach the store within seconds
            with urllib.request.urlopen(store + "/api/v1/query?query=count(up%3D%3D1)", timeout=5) as response:
                result = json.load(response)["data"]["result"]
            if result and result[0]["value"][1] == "5":
                break
            time.sleep(0.5)
        assert result and result[0]["value"][1] == "5", result
        # The month of past jobs the Trends page reads, as Prometheus has it from promtool's backfill.
        assert "the past jobs' hourly GPU-hours are in VictoriaMetrics too (its import)" in lines
        week = "count(count_over_time(namespace_user:gpulens_job_gpu_hours:increase1h[20d]%20offset%207d))"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # an import is searchable within seconds
            with urllib.request.urlopen(f"{store}/api/v1/query?query={week}", timeout=5) as response:
                past = json.load(response)["data"]["result"]
            if past:
                break
            time.sleep(0.5)
        assert past and float(past[0]["value"][1]) > 0, past
    finally:
        assert stop(process) == 0


def test_a_port_in_use_is_one_clear_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([*GPULENS, "demo", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"gpulens demo: cannot listen on 127.0.0.1:{port} (Address already in use); choose another port with --port"
    ]


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["dashboard"], 2, "one of the arguments --prometheus --agents is required"),
        (  # HOST:PORT is taken for http://HOST:PORT, as the reports take it; a bare host names no port
            ["dashboard", "--agents", "gpu-node"],
            1,
            "--agents: agent URL 'gpu-node' is not HOST:PORT or http(s)://HOST:PORT; write e.g. http://gpu-node-1",
        ),
        (["dashboard", "--prometheus", "ftp://prometheus:9090"], 1, "'ftp://prometheus:9090' is not HOST:PORT"),
        (["dashboard", "--prometheus", ""], 1, "--prometheus '' is not HOST:PORT or http(s)://HOST:PORT"),
        (["dashboard", "--agents", ""], 1, "--agents: no agent URL given; write e.g. --agents http://"),
        (
            ["dashboard", "--prometheus", "http://p:9090", "--bearer-token-file", "/nonexistent/token"],
            1,
            "cannot read the bearer token file",
        ),
        (["demo", "--port", "many"], 2, "argument --port: 'many' is not a port; choose one from 1 to 65535"),
        # The agents' own range, checked before any starts (1e9 started the fleet, then its agents refused it).
        (["demo", "--speed", "1e9"], 2, "argument --speed: 1e+09 is out of range; choose between 0.001 and 10000"),
        (["demo", "--speed", "inf"], 2, "argument --speed: inf is out of range"),
        (["dashboard", "--agents", "http://a:10906", "--address", ""], 2, "'' is not an address; give one of"),
        (["dashboard", "--agents", "http://a:10906", "--address", "nosuch.invalid"], 1, "an address of this machine"),
        (["dashboard", "--agents", "http://a:10906", "--port", "70000"], 2, "'70000' is not a port"),
        (["demo", "--prometheus", "--victoriametrics"], 2, "argument --victoriametrics: not allowed with argument"),
        (["demo", "--agents", "--prometheus"], 2, "argument --prometheus: not allowed with argument --agents"),
        (
            ["dashboard", "--agents", "http://a:10906", "--alertmanager", "http://am:9093"],
            2,
            "--alertmanager goes with --prometheus",
        ),
        (
            ["dashboard", "--prometheus", "http://p:9090", "--alertmanager", "am"],
            1,
            "--alertmanager 'am' is not HOST:PORT or http(s)://HOST:PORT; write e.g. http://alertmanager:9093",
        ),
    ],
)
def test_usage_mistakes_are_one_line_and_a_non_zero_exit(args, code, said):
    result = subprocess.run([*GPULENS, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr


@pytest.mark.parametrize(
    ("args", "environ", "code", "said"),
    [
        # Agents read their credentials from GPULENS_AGENT_*: the Prometheus flags would be ignored.
        (["--agents", "http://a:10906", "--bearer-token-file", "t"], {}, 2, "are for --prometheus; agents read"),
        # A password on the command line is in the process list: refused, and not printed.
        (["--prometheus", "http://ops:hunter2@p:9090"], {}, 1, "holds a password, which every user"),
        (["--agents", "n=http://ops:hunter2@a:10906"], {}, 1, "GPULENS_AGENT_BASIC_AUTH_FILE"),
        (
            ["--prometheus", "http://p:9090", "--alertmanager", "http://ops:hunter2@am:9093"],
            {},
            1,
            "--alertmanager 'http://am:9093' holds a password",
        ),
        # The agents' settings are checked before the dashboard starts, not on every page.
        (["--agents", "http://a:10906"], {"GPULENS_AGENT_CA_FILE": "/absent.pem"}, 1, "GPULENS_AGENT_CA_FILE"),
        (["--agents", "http://a:10906"], {"GPULENS_AGENT_BASIC_AUTH_FILE": "/absent"}, 1, "cannot read"),
    ],
)
def test_credential_mistakes_stop_the_dashboard_before_it_starts(args, environ, code, said):
    result = subprocess.run(
        [*GPULENS, "dashboard", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **environ},
    )
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "hunter2" not in result.stderr, result.stderr


def test_an_address_not_of_this_machine_names_the_address_flag():
    from gpulens.dashboard.launch import LaunchError, check_port

    try:
        check_port("203.0.113.7", 0, "--port")  # TEST-NET-3: on no interface
    except LaunchError as error:
        assert str(error).endswith("choose an address of this machine with --address")
    else:
        pytest.skip("this machine binds addresses it does not have (ip_nonlocal_bind)")


def test_a_basic_auth_file_without_a_colon_is_refused():
    with tempfile.NamedTemporaryFile("w", suffix=".auth") as auth:
        auth.write("justauser\n")
        auth.flush()
        result = subprocess.run(
            [*GPULENS, "dashboard", "--prometheus", "http://p:9090", "--basic-auth-file", auth.name],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1 and "must hold USER:PASSWORD" in result.stderr
    assert "justauser" not in result.stderr
