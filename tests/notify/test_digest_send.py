"""`gpulens report digest --send`: each person's part, or each account's to its lead, through the sender to a
real SMTP server on loopback; the same digest sent again is suppressed; a recipient with no address costs only
their message and the exit status."""

from __future__ import annotations

import pytest

from gpulens.report.cli import run
from tests.notify.servers import digest_settings, smtp_server
from tests.report.test_digest import T0, H, ledger  # noqa: F401 - the fixture: seven known jobs in a ledger


@pytest.fixture
def box():
    with smtp_server() as box:
        yield box


def settings(tmp_path, box) -> str:
    return digest_settings(tmp_path, box.port)


def send(capsys, ledger: str, config: str, by: str) -> tuple[int, list[str], str]:  # noqa: F811
    period = ["--since", f"{T0 - 60:.0f}", "--until", f"{T0 + 20 * H:.0f}"]
    status = run(["digest", "--ledger", ledger, *period, "--by", by, "--send", "--notify-config", config])
    said = capsys.readouterr()
    return status, said.out.splitlines(), said.err


def test_each_person_gets_their_own_part_once(tmp_path, box, capsys, ledger):  # noqa: F811
    config = settings(tmp_path, box)
    status, lines, err = send(capsys, ledger, config, "user")
    assert (status, err) == (0, "")
    assert lines == [f"{user}: sent to {user}@example.org" for user in ("alice", "bob", "carol", "dave")]
    mail = {m.recipients[0]: m for m in box.received}
    assert (
        mail["alice@example.org"].mail["Subject"] == "[gpulens] GPU use, 2025-12-31 23:59 UTC to 2026-01-01 20:00 UTC"
    )
    alice = mail["alice@example.org"].body
    assert "Hello alice," in alice and "30.03" in alice and "slurm 102" in alice
    assert "carol" not in alice and "slurm 201" not in alice  # nobody else's jobs
    status, lines, _ = send(capsys, ledger, config, "user")
    assert status == 0 and all(": suppressed: sent at " in line for line in lines) and len(box.received) == 4


def test_by_account_each_lead_gets_the_accounts_part_and_a_missing_lead_fails_alone(tmp_path, box, capsys, ledger):  # noqa: F811
    status, lines, _ = send(capsys, ledger, settings(tmp_path, box), "account")
    assert status == 1  # vision has no lead
    assert lines == [
        "(none): the jobs without an account have no lead to send them to",
        "lead of climate: sent to pi@climate.example.org",
        "lead of vision: no_address: no lead for account vision: name one in the map file's accounts",
    ]
    (lead,) = box.received
    assert "alice" in lead.body and "bob" in lead.body and "carol" not in lead.body and "Hello" not in lead.body


def test_send_mistakes_are_usage_errors_before_anything_is_read(tmp_path, capsys, ledger):  # noqa: F811
    assert run(["digest", "--ledger", ledger, "--send", "--notify-config", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == (
        f"gpulens report: config file {tmp_path / 'none.yaml'}: cannot be read (No such file or directory); "
        "check --notify-config\n"
    )
    assert run(["digest", "--ledger", ledger, "--notify-config", "x.yaml"]) == 2
    assert capsys.readouterr().err == "gpulens report: --notify-config goes with --send\n"
    assert run(["digest", "--ledger", ledger, "--send", "--format", "json"]) == 2
    assert "leave out --output and --format" in capsys.readouterr().err
