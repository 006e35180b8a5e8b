"""The reclaim service's HTTP API on a real loopback port: /metrics, the keeps in force, and a keep over HTTP,
refused without credentials, a 400 naming the field for each mistake, recorded as `gpulens reclaim keep`
records it, and honoured by the ladder; then the dashboard's client (gpulens/reclaim_api.py) against it."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
import requests
from prometheus_client import CollectorRegistry, Counter

from gpulens.agent.webconfig import WebConfigFile
from gpulens.credentials import Credentials, tls_credentials
from gpulens.httpclient import HttpError
from gpulens.reclaim.folder import LOCK, Folder
from gpulens.reclaim.ladder import Keep
from gpulens.reclaim.server import EXAMPLE, MAX_BODY_BYTES, REFUSED, start
from gpulens.reclaim_api import FLAGS, KEEPS, KeepShown, ReclaimApi
from tests.agent.webcerts import Pki
from tests.reclaim.test_cli import run
from tests.reclaim.test_ladder import gpu
from tests.reclaim.test_service import audit, run_until, service

PASSWORD = "correct horse"
ASKED = {"job_kind": "slurm", "job_id": "1234", "for": "8h", "reason": "evaluation   at 18:00", "by": "ann"}


def web_config(folder: Path, excluded: tuple[str, ...] = ("/metrics",)) -> WebConfigFile:
    """A web config with one user, `dashboard`, whose password is PASSWORD (bcrypt at its lowest cost: fast)."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path = folder / "web-config.yml"
    path.write_text(f"basic_auth_users:\n  dashboard: '{hashed}'\nauth_excluded_paths: {list(excluded)}\n")
    return WebConfigFile(str(path))


@contextmanager
def reclaim_server(
    folder: Folder,
    web: WebConfigFile | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[str]:
    """Serve the service's endpoints over `folder` on a free loopback port; yield the base URL."""
    server = start(registry or CollectorRegistry(), folder, "127.0.0.1", 0, web, clock)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def folder(tmp_path) -> Folder:
    """The folder of the service the endpoints are part of: one it has run in."""
    made = Folder(tmp_path / "state").create()
    (made.path / LOCK).write_text("pid 812\n")
    return made


@pytest.fixture
def guarded(tmp_path, folder) -> Iterator[str]:
    with reclaim_server(folder, web_config(tmp_path)) as url:
        yield url


JSON = {"Content-Type": "application/json"}


def post(
    url: str, body: object, auth: tuple[str, str] | None = ("dashboard", PASSWORD), headers: dict[str, str] = JSON
) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(url + KEEPS, data=data, auth=auth, timeout=10, headers=headers)


def test_a_keep_over_http_is_recorded_as_the_command_line_records_it_and_listed_while_in_force(guarded, folder):
    response = post(guarded, ASKED)
    assert response.status_code == 201, response.text
    (keep,) = folder.keeps()
    assert (keep.job, keep.by, keep.reason) == ("slurm/1234", "ann via dashboard", "evaluation at 18:00")
    assert 8 * 3600 - 5 < keep.until - time.time() <= 8 * 3600
    assert response.json() == {"keep": dataclasses.asdict(keep)}
    (record,) = folder.audit_records()
    said = {"job": keep.job, "by": keep.by, "until": keep.until, "reason": keep.reason}
    assert record == {"time": keep.at, "event": "kept", **said}  # the CLI's record, tests/reclaim/test_cli.py
    # The keeps in force only: one that has ended is history, in the audit log.
    folder.add_keep(Keep("slurm/9", time.time() - 1, "bob", "over", time.time() - 3600))
    listed = requests.get(guarded + KEEPS, auth=("dashboard", PASSWORD), timeout=10)
    assert listed.status_code == 200 and [k["job"] for k in listed.json()["keeps"]] == ["slurm/1234"]


def test_the_log_reads_a_keep_over_http_as_one_from_the_command_line(guarded, folder, capsys):
    assert post(guarded, {**ASKED, "job_kind": "kubernetes", "job_id": "0c1d-uid", "for": 7200}).status_code == 201
    status, out, _ = run(capsys, "log", "--state-dir", str(folder.path))
    assert status == 0 and "  kept          kubernetes/0c1d-uid, by ann via dashboard until " in out
    assert out.rstrip().endswith(": evaluation at 18:00")


def test_a_pod_known_only_by_its_allocation_is_kept_by_namespace_and_name(guarded, folder, capsys):
    """The agent names a pod that runs no process NAMESPACE/NAME (it reads no UID): the dashboard, the API and the
    command line take that id for a Kubernetes job, and for no other kind."""
    asked = {**ASKED, "job_kind": "kubernetes", "job_id": "research/notebook-ken-0"}
    assert post(guarded, asked).status_code == 201
    assert [k.job for k in folder.keeps()] == ["kubernetes/research/notebook-ken-0"]
    status, out, _ = run(capsys, "log", "--state-dir", str(folder.path), "--job", "kubernetes/research/notebook-ken-0")
    assert status == 0 and "kept          kubernetes/research/notebook-ken-0, by ann" in out
    refused = post(guarded, {**ASKED, "job_id": "research/notebook-ken-0"})
    assert refused.status_code == 400 and "job_id: 'research/notebook-ken-0' is not a job id" in refused.text


def test_without_a_web_config_a_keep_over_http_is_refused_in_one_line_and_the_metrics_are_served(folder):
    registry = CollectorRegistry()
    Counter("gpulens_reclaim_cycle_errors", "errors", registry=registry)
    with reclaim_server(folder, registry=registry) as url:
        refused = post(url, ASKED, auth=None)
        assert refused.status_code == 403 and refused.text == REFUSED + "\n" and len(REFUSED) < 200
        assert "gpulens_reclaim_cycle_errors_total 0.0" in requests.get(url + "/metrics", timeout=10).text
        assert requests.get(url + KEEPS, timeout=10).json() == {"keeps": []}
        assert requests.get(url + "/", timeout=10).status_code == 404
        put = requests.put(url + KEEPS, timeout=10)
        assert (put.status_code, put.headers.get("Allow")) == (405, "GET, HEAD, POST, DELETE")
        head = requests.head(url + "/metrics", timeout=10)  # prometheus_client's app serves GET alone
        assert head.status_code == 200 and head.content == b"" and int(head.headers["Content-Length"]) > 0
    assert folder.keeps() == [] and list(folder.audit_records()) == []


def test_a_keep_needs_the_password_and_a_path_left_out_of_auth_keeps_nothing(tmp_path, guarded, folder):
    assert post(guarded, ASKED, auth=None).status_code == 401
    assert post(guarded, ASKED, auth=("dashboard", "wrong")).status_code == 401
    assert post(guarded, ASKED, auth=("eve", PASSWORD)).status_code == 401
    assert requests.get(guarded + "/metrics", timeout=10).status_code == 200  # excluded: Prometheus scrapes it
    # A web config that lets the keeps' path through without a password lets no keep through.
    (tmp_path / "open").mkdir()
    with reclaim_server(folder, web_config(tmp_path / "open", excluded=("/metrics", KEEPS))) as url:
        refused = post(url, ASKED, auth=None)
        assert refused.status_code == 403 and refused.text == REFUSED + "\n"
    assert folder.keeps() == []


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({**ASKED, "for": "8 hours"}, "for: '8 hours' is not a duration; write e.g. '30s', '5m' or '7d'"),
        ({**ASKED, "for": "0s"}, "for: must be above 0; write e.g. '8h'"),
        ({**ASKED, "for": -60}, "for: '-60' must not be negative; write e.g. '30s', '5m' or '7d'"),
        ({**ASKED, "for": True}, "for: expected a duration such as '8h' or seconds, got true"),
        # A keep past 9999 would be a line the service cannot read back: it would keep nothing.
        (
            {**ASKED, "for": 10**12},
            "for: 1000000000000 would end after the year 9999; to keep a job for good, exempt it in ",
        ),
        ({**ASKED, "job_id": " "}, "job_id: '' is not a job id; write it as the log names it, e.g. '1234'"),
        ({**ASKED, "reason": "  "}, "reason: expected text that is not blank, got the string '  '"),
        ({**ASKED, "by": None}, "by: expected text that is not blank, got null"),
        ({**ASKED, "job_kind": "slrum"}, "job_kind: unknown value 'slrum'; did you mean 'slurm'?"),
        ({**ASKED, "job_id": "12 34"}, "job_id: '12 34' is not a job id; write it as the log names it, e.g. '1234'"),
        ({**ASKED, "until": "18:00"}, "the body: unknown key 'until'; use one of job_kind, job_id, for, reason, by"),
        ({k: v for k, v in ASKED.items() if k != "reason"}, f"the body: missing key 'reason'; add it; {EXAMPLE}"),
        ([ASKED], f"the body: expected a mapping, got a list; {EXAMPLE}"),
        (b"job=1234", f"the body: not JSON (Expecting value at character 0); {EXAMPLE}"),
        (b"[" * 5000 + b"]" * 5000, "the body: is JSON nested too deep"),
        # `reclaim log` prints reason and by as they are: a terminal escape or a NUL would reach the operator's.
        ({**ASKED, "reason": "r\u001b[2J\u001b[31mFAKE"}, "reason: 'r\\x1b[2J\\x1b[31mFAKE' holds characters that are"),
        ({**ASKED, "by": "\u202eann"}, "by: '\\u202eann' holds characters that are not printable; write plain text"),
        (b"", f"the body: empty; {EXAMPLE}"),
    ],
)
def test_each_mistake_in_a_keep_is_a_400_naming_the_field_and_the_fix(guarded, folder, body, said):
    response = post(guarded, body)
    assert response.status_code == 400 and response.json()["error"].startswith(said), response.text
    assert "\n" not in response.json()["error"]
    assert folder.keeps() == []


@pytest.mark.parametrize("sent", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_keep_not_sent_as_json_is_refused(guarded, folder, sent):
    """A browser posts text/plain or a form to any origin without asking first (no CORS preflight), with the
    credentials it holds for the service: only application/json is taken."""
    response = post(guarded, ASKED, headers={"Content-Type": sent} if sent else {})
    assert response.status_code == 415 and "send it as application/json" in response.json()["error"], response.text
    assert folder.keeps() == []


def test_a_body_too_long_for_a_keep_is_refused_unread(guarded, folder):
    response = post(guarded, {**ASKED, "reason": "x" * MAX_BODY_BYTES})
    assert response.status_code == 413 and f"over {MAX_BODY_BYTES} bytes" in response.json()["error"]
    assert folder.keeps() == []


def test_the_ladder_honours_a_keep_over_http_and_warns_again_when_it_ends(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 70)
    with reclaim_server(folder, web_config(tmp_path), clock=clock) as url:
        assert post(url, {**ASKED, "job_id": "100", "for": "129m"}).status_code == 201
    run_until(made, clock, 230)
    assert audit(folder) == [
        (60, "warned", "slurm/100"),
        (71, "kept", "slurm/100"),
        (71, "skipped", "slurm/100"),
        (200, "warned", "slurm/100"),
        (215, "acted", "slurm/100"),
    ]
    skipped = [r for r in folder.audit_records() if r["event"] == "skipped"][0]
    assert skipped["reason"].startswith("kept by ann via dashboard until ")
    assert ("scancel", "100") in slurm.commands


def test_over_https_a_verified_client_certificate_may_keep_and_a_client_without_one_may_not(tmp_path, folder):
    pki = Pki.make(tmp_path, client_name="dashboard.gpulens.svc")
    web = WebConfigFile(str(pki.web_config(client_auth="VerifyClientCertIfGiven")))
    with reclaim_server(folder, web) as url:
        url = url.replace("http://127.0.0.1", "https://localhost")
        tls = tls_credentials(str(pki.ca_file), str(pki.client_cert), str(pki.client_key), FLAGS[1:], "its")
        kept = ReclaimApi(url, tls).keep("slurm", "1234", "8h", "evaluation at 18:00", "ann")
        assert kept.by == "ann via dashboard.gpulens.svc"
        with pytest.raises(HttpError, match="HTTP 403"):
            ReclaimApi(url, tls_credentials(str(pki.ca_file), None, None, FLAGS[1:], "its")).keep(
                "slurm", "1", "8h", "why", "eve"
            )
    assert [k.job for k in folder.keeps()] == ["slurm/1234"]


def test_a_keep_ended_over_http_stops_holding_the_job_and_one_not_in_force_is_a_404(guarded, folder):
    assert post(guarded, ASKED).status_code == 201
    assert post(guarded, {**ASKED, "for": "1h", "by": "bob"}).status_code == 201
    end = {"job_kind": "slurm", "job_id": "1234", "reason": "the evaluation is over", "by": "ann"}
    ended = requests.delete(
        guarded + KEEPS, data=json.dumps(end), auth=("dashboard", PASSWORD), timeout=10, headers=JSON
    )
    assert ended.status_code == 200, ended.text
    keep = ended.json()["ended"]
    assert keep["until"] == keep["at"] and keep["by"] == "ann via dashboard"  # both keeps before it end
    listed = requests.get(guarded + KEEPS, auth=("dashboard", PASSWORD), timeout=10)
    assert listed.json() == {"keeps": []}
    assert [r["event"] for r in folder.audit_records()] == ["kept", "kept", "keep_ended"]
    again = requests.delete(
        guarded + KEEPS, data=json.dumps(end), auth=("dashboard", PASSWORD), timeout=10, headers=JSON
    )
    assert again.status_code == 404 and again.json() == {"error": "no keep of slurm/1234 is in force: nothing to end"}
    refused = requests.delete(guarded + KEEPS, data=json.dumps(end), timeout=10, headers=JSON)
    assert refused.status_code == 401  # the Guard asks for the password first
    bad = requests.delete(
        guarded + KEEPS, data=json.dumps({**end, "for": "1h"}), auth=("dashboard", PASSWORD), headers=JSON
    )
    assert bad.status_code == 400 and "for" in bad.json()["error"]


# -- the dashboard's client --------------------------------------------------------------------------------


def test_the_client_keeps_a_job_and_lists_the_keeps(guarded):
    api = ReclaimApi(guarded + "/", Credentials(basic_auth=("dashboard", PASSWORD)))
    kept = api.keep("kubernetes", "0c1d-uid", "4h", "demo on Friday", "Ada Lovelace <ada@example.org>")
    assert (kept.job_kind, kept.job_id) == ("kubernetes", "0c1d-uid")
    assert kept.by == "Ada Lovelace <ada@example.org> via dashboard"
    assert api.keeps() == (kept,) and isinstance(kept, KeepShown)
    ended = api.end_keep("kubernetes", "0c1d-uid", "the demo moved", "Ada Lovelace <ada@example.org>")
    assert ended.until == ended.at and api.keeps() == ()
    with pytest.raises(HttpError, match="answered HTTP 404 to /api/v1/keeps: no keep of kubernetes/0c1d-uid"):
        api.end_keep("kubernetes", "0c1d-uid", "again", "ada")


def test_the_clients_failures_are_one_line_with_what_the_service_said(guarded, folder):
    api = ReclaimApi(guarded, Credentials(basic_auth=("dashboard", PASSWORD)))
    with pytest.raises(HttpError) as bad:
        api.keep("slurm", "1234", "8 hours", "why", "ann")
    assert str(bad.value) == (
        f"gpulens reclaim at {guarded} answered HTTP 400 to {KEEPS}: for: '8 hours' is not a duration; "
        "write e.g. '30s', '5m' or '7d'"
    )
    with pytest.raises(HttpError, match="asks for credentials; give the dashboard --reclaim-basic-auth-file"):
        ReclaimApi(guarded).keep("slurm", "1234", "8h", "why", "ann")
    with reclaim_server(folder) as open_url, pytest.raises(HttpError) as refused:
        ReclaimApi(open_url, Credentials(basic_auth=("dashboard", PASSWORD))).keep("slurm", "1", "8h", "why", "ann")
    assert f"refused the credentials (HTTP 403: {REFUSED})" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(HttpError, match="answered HTTP 404 to /api/v1/keeps"):
        ReclaimApi(guarded + "/elsewhere", Credentials(basic_auth=("dashboard", PASSWORD))).keeps()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("--web.config.file", "/nonexistent/web.yml"), "/nonexistent/web.yml"),
        (("--web.config.file", "web.yml", "--port", "0"), "--web.config.file goes with a --port to serve"),
    ],
)
def test_the_services_web_config_mistakes_are_one_line_and_exit_2(tmp_path, capsys, argv, said):
    state = ("--state-dir", str(tmp_path / "state"))
    status, _, err = run(capsys, "run", "--agents", "http://127.0.0.1:1", *argv, *state)
    assert status == 2 and err.count("\n") == 1 and said in err, err


def test_the_dashboard_reads_the_pending_actions_from_the_service_where_no_prometheus_does(folder):
    """A dashboard that reads the agents showed no notice: its source answered none, and nothing said why."""
    from prometheus_client.core import GaugeMetricFamily

    class Pending:
        def collect(self):
            family = GaugeMetricFamily(
                "gpulens_reclaim_pending_action_timestamp_seconds",
                "due",
                labels=["job_kind", "job_id", "user", "account", "policy", "action", "mode", "held"],
            )
            family.add_metric(["slurm", "1001", "bob", "", "default", "cancel", "notify", "false"], 1_800_000_600)
            yield family

    registry = CollectorRegistry()
    registry.register(Pending())
    with reclaim_server(folder, registry=registry) as url:
        (pending,) = ReclaimApi(url).pending()
    assert (pending.job_kind, pending.job_id, pending.user, pending.mode, pending.due_at, pending.held) == (
        "slurm",
        "1001",
        "bob",
        "notify",
        1_800_000_600,
        False,
    )
    with reclaim_server(folder) as url, pytest.raises(HttpError):
        ReclaimApi(url + "/nothing-here").pending()
