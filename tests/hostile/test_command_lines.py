"""Command lines and the settings they pass on: `gpulens report`, `gpulens probe`, `gpulens dashboard` and
`gpulens demo`, the agent's listen address. Whatever is typed ends in a result or one line on stderr
with the documented exit status; no process is started and nothing reaches the network."""

from __future__ import annotations

import contextlib
import io
import socket

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent.server import serve
from gpulens.dashboard import demo, launch
from gpulens.fleet.environment import ConfigError, from_environment, parse_agents
from gpulens.probes import cli as probe_cli
from gpulens.report import cli as report_cli
from tests.conftest import make_agent
from tests.hostile.common import TEXT, hostile, one_line
from tests.tools import free_port

NOW = 1_767_225_600.0
TIMES = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "now",
            "7d",
            "1h",
            "2w",
            "0s",
            "300s",
            "1.5d",
            "٣d",
            "9" * 400 + "d",
            "1e400",
            "inf",
            "-inf",
            "nan",
            "NaN",
            "1e300",
            "-1e300",
            "1767225600",
            "0",
            "-1",
            "253402300800",
            "2026-01-31",
            "2026-02-30",
            "9999-12-31",
            "0000-01-01",
            "2026-01-31T12:00:00Z",
            "2026-01-31 12:00",
            "1 d",
            "d",
            "",
            " ",
        ]
    ),
)


def run_captured(main, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own exit, as for a usage error
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def one_stderr_line(err: str, prefix: str) -> str:
    assert err.endswith("\n") and err.startswith(prefix), err
    return one_line(err[:-1])


# -------------------------------------------------------------- gpulens report


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("report-ledger") / "ledger.sqlite"
    agent = make_agent("demo", ledger=str(path))
    agent.run(120, step=4)
    agent.accounting.ledger.close()
    return str(path)


CLOSED = f"127.0.0.1:{free_port()}"  # nothing listens there: refused at once
URLS = st.one_of(
    st.sampled_from(
        [
            f"http://{CLOSED}",
            CLOSED,
            f"http://{CLOSED}/metrics",
            "http://[::1",
            "http://127.0.0.1:abc",
            "http://[::1]:99999",
            "http://127.0.0.1:99999",
            "ftp://127.0.0.1:1",
            "",
            "http://",
            "http://user:pw@127.0.0.1:1",
            "://",
            "http://\x00",
            "http://127.0.0.1:1/\n",
            "http://é.invalid.",
            "file:///etc/passwd",
        ]
    ),
    TEXT.map(lambda text: f"http://127.0.0.1:1/{text}"),
)
REPORT_OPTIONS = {
    "--since": TIMES,
    "--until": TIMES,
    "--min-duration": TIMES,
    "--by": st.one_of(TEXT, st.just("user")),
    "--format": st.sampled_from(["json", "csv", "markdown", "html", "terminal", "pdf"]),
    "--source": st.sampled_from(["ledger", "agent", "prometheus", "x"]),
    "--agent": URLS,
    "--prometheus": URLS,
}


@st.composite
def report_argv(draw, ledger: str):
    argv = [draw(st.sampled_from(["job", "fleet", "digest", "jobs", ""]))]
    if argv[0] == "job":
        argv.append(draw(st.one_of(TEXT, st.sampled_from(["81234", "jupyter-bob-7f9c", "-x"]))))
    for option in draw(st.lists(st.sampled_from(sorted(REPORT_OPTIONS)), max_size=4)):
        argv += [option, draw(REPORT_OPTIONS[option])]
    if draw(st.booleans()):
        argv += ["--ledger", ledger]
    return argv


@hostile(150)
@given(st.data())
@example(data=None)
def test_any_report_command_line_ends_in_a_report_or_one_line(ledger, data):
    cases = (
        [
            ["fleet", "--ledger", ledger, "--since", "1e300", "--until", "now"],  # a time no calendar can print
            ["fleet", "--ledger", ledger, "--until", "inf"],
            ["fleet", "--ledger", ledger, "--since", "9" * 400 + "d"],
            ["fleet", "--ledger", ledger, "--since", "nan"],
            ["fleet", "--agent", "http://[::1"],  # a URL urllib cannot split
            ["fleet", "--agent", "http://127.0.0.1:abc"],
            ["job", "x", "--prometheus", "http://127.0.0.1:99999"],
            ["fleet", "--ledger", ledger, "--by", "a\nb"],
        ]
        if data is None
        else [data.draw(report_argv(ledger))]
    )
    for argv in cases:
        code, out, err = run_captured(lambda a: report_cli.run(a, now=NOW), argv)
        assert code in (0, 1, 2), err
        if code:
            one_stderr_line(err, "gpulens report: ")
        else:
            assert out and not err


# -------------------------------------------------------------- gpulens probe


@pytest.fixture(scope="module")
def probe_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probe")
    one = folder / "one.yaml"
    one.write_text('name: one\ndescription: "one GPU"\ngpus:\n  - {model: "NVIDIA H100 80GB HBM3"}\n')
    binary = folder / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    return {"one": str(one), "binary": str(binary), "folder": str(folder)}


NUMBER_TEXT = st.one_of(
    TEXT,
    st.sampled_from(
        ["0", "1", "0.5", "-1", "nan", "inf", "-inf", "1e400", "64", "65536", "9" * 400, "1e-300", "0x10", "1_000", "٣"]
    ),
)


@st.composite
def probe_argv(draw, files):
    argv = []
    options = {
        "--simulate": st.sampled_from([files["one"], files["binary"], files["folder"], "nope", "", "a\x00b"]),
        "--gpu": st.one_of(TEXT, st.sampled_from(["0", "1", "0,0", ",", "GPU-", "0," * 50])),
        "--min-peak-ratio": NUMBER_TEXT,
        "--time-budget": NUMBER_TEXT,
        "--memory-fraction": NUMBER_TEXT,
        "--matmul-size": NUMBER_TEXT,
        "--copy-mib": NUMBER_TEXT,
        "--repeats": NUMBER_TEXT,
        "--simulate-time": NUMBER_TEXT,
        "--device": st.sampled_from(["cuda", "gpu", "", "CPU"]),
    }
    for option in draw(st.lists(st.sampled_from(sorted(options)), max_size=5)):
        argv += [option, draw(options[option])]
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(["--json", "--no-peer", "--bogus", "-"])))
    return argv


@hostile(150)
@given(st.data())
@example(data=None)
def test_any_probe_command_line_ends_in_results_or_one_line(probe_files, data):
    cases = (
        [
            ["--simulate", probe_files["binary"]],  # a scenario file that is not UTF-8
            ["--simulate", "a\x00b"],
            ["--simulate", probe_files["one"], "--simulate-time", "inf"],
            ["--simulate", probe_files["one"], "--simulate-time", "1e300"],
            ["--time-budget", "9" * 400],
        ]
        if data is None
        else [data.draw(probe_argv(probe_files))]
    )
    for argv in cases:
        out, err = io.StringIO(), io.StringIO()
        code = probe_cli.main(argv, stdout=out, stderr=err)
        assert code in (0, 1, 2, 3, 4), err.getvalue()
        if code == 2:
            one_stderr_line(err.getvalue(), "gpulens probe: ")


# -------------------------------------------------------------- gpulens dashboard and demo


@pytest.fixture(scope="module")
def busy_port():
    """A port something already listens on, so that every launch stops before starting a process."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.fixture(scope="module")
def secret_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secrets")
    files = {
        "userpw": "user:pw\n",
        "token": "t0ken\n",
        "nocolon": "userpw\n",
        "empty": "",
        "toml": '[auth]\nredirect_uri = "http://x/oauth2callback"\n',
        "badtoml": "[auth\n",
    }
    paths = {}
    for name, text in files.items():
        (folder / name).write_text(text)
        paths[name] = str(folder / name)
    (folder / "binary").write_bytes(b"\xff\xfe\x00\x80")
    paths["binary"] = str(folder / "binary")
    return [*paths.values(), str(folder), str(folder / "absent"), "a\x00b", ""]


@st.composite
def dashboard_argv(draw, files, busy):
    options = {
        "--prometheus": URLS,
        "--agents": st.one_of(URLS, URLS.map(lambda url: f"a={url},b={url}")),
        "--bearer-token-file": st.sampled_from(files),
        "--basic-auth-file": st.sampled_from(files),
        "--auth-file": st.sampled_from(files),
        "--refresh": NUMBER_TEXT,
        "--port": NUMBER_TEXT,
    }
    argv = []
    for option in draw(st.lists(st.sampled_from(sorted(options)), max_size=4)):
        argv += [option, draw(options[option])]
    return [*argv, "--port", str(busy), "--address", "127.0.0.1"]


@hostile(120)
@given(st.data())
@example(data=None)
def test_any_dashboard_command_line_ends_in_one_line(secret_files, busy_port, data):
    binary, folder = secret_files[-5], secret_files[-4]
    busy = ["--port", str(busy_port)]
    cases = (
        [
            ["--prometheus", "http://127.0.0.1:1", "--basic-auth-file", binary, *busy],  # not UTF-8
            ["--prometheus", "http://127.0.0.1:1", "--bearer-token-file", "a\x00b", *busy],
            ["--prometheus", "http://127.0.0.1:1", "--basic-auth-file", folder, *busy],
            ["--agents", "http://[::1", *busy],  # a URL urllib cannot split
            ["--agents", "a=http://127.0.0.1:abc", *busy],
            ["--prometheus", "http://127.0.0.1:1", "--auth-file", "a\x00b", *busy],
            ["--prometheus", "http://127.0.0.1:1", "--port", "99999"],  # a port bind() refuses
            ["--prometheus", "http://127.0.0.1:1", "--port", "-1"],
            ["--prometheus", "http://127.0.0.1:1", "--refresh", "nan", *busy],
        ]
        if data is None
        else [data.draw(dashboard_argv(secret_files, busy_port))]
    )
    for argv in cases:
        code, out, err = run_captured(launch.dashboard_main, argv)
        assert code in (1, 2), err
        one_line(one_stderr_line(err, "gpulens dashboard"))


@hostile(40)
@given(
    st.lists(st.one_of(st.sampled_from(["--speed", "--refresh", "--prometheus", "--port"]), NUMBER_TEXT), max_size=4)
)
@example(["--speed", "nan"])
def test_any_demo_command_line_ends_in_one_line(busy_port, argv):
    code, out, err = run_captured(demo.demo_main, [*argv, "--port", str(busy_port)])
    assert code in (1, 2), err
    one_line(one_stderr_line(err, "gpulens demo"))


# -------------------------------------------------------------- where the dashboard and the agent listen

AGENT_LISTS = st.one_of(
    URLS,
    TEXT,
    st.lists(st.tuples(st.one_of(TEXT, st.just("")), URLS), max_size=3).map(
        lambda pairs: ",".join(f"{name}={url}" if name else url for name, url in pairs)
    ),
)


@hostile(150)
@given(
    AGENT_LISTS,
    st.dictionaries(
        st.sampled_from(
            ["GPULENS_DASHBOARD_PROMETHEUS", "GPULENS_PROMETHEUS_BASIC_AUTH", "GPULENS_PROMETHEUS_BEARER_TOKEN"]
        ),
        TEXT,
        max_size=3,
    ),
)
@example("http://[::1", {})
@example("a=http://127.0.0.1:abc", {})  # a port that urllib refuses only when asked for it
@example("http://127.0.0.1:1", {"GPULENS_DASHBOARD_PROMETHEUS": "http://[::1"})
def test_any_source_setting_gives_a_source_or_one_config_error(agents, environ):
    try:
        parse_agents(agents)
    except ConfigError as error:
        one_line(error)
    for settings in ({**environ, "GPULENS_DASHBOARD_AGENTS": agents}, environ):
        try:
            source = from_environment(settings)
        except ConfigError as error:
            one_line(error)
            continue
        if hasattr(source, "refresh"):
            source.refresh()  # the agents at those URLs are down: problems, not exceptions
            for problem in source.fleet(3600).problems:
                one_line(problem)


HOSTS = st.sampled_from(["", "127.0.0.1", "::1", "0.0.0.0", "\x00", "127.0.0.1\x00", "é" * 300, "[::1]"])


@hostile(40)
@given(HOSTS, st.one_of(st.integers(-(2**40), 2**40), st.sampled_from([0, 65535, 65536, -1])))
@example("é" * 300, 0)  # a name IDNA cannot encode: TypeError
@example("\x00", 0)
@example("127.0.0.1", 65536)
def test_serve_binds_or_raises_os_error(host, port):
    try:
        server = serve(lambda environ, start_response: [], host, port)
    except OSError as error:
        assert error.strerror or str(error)
        return
    server.server_close()


def test_any_refresh_setting_gives_a_finite_period(monkeypatch):
    from gpulens.dashboard import context

    for text in ("nan", "inf", "-inf", "1e400", "-5", "0", "abc", "", "١٥", "15", "1e9"):
        monkeypatch.setenv(context.REFRESH_VARIABLE, text)
        assert 2.0 <= context.refresh_seconds() <= 86_400.0, text
