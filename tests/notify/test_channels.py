"""The channels against real servers on loopback: mail received by an SMTP server (plain, STARTTLS with a
login, implicit TLS) with its headers and body as sent; webhooks posted as Slack and Mattermost take them;
each failure one line naming the server and the fix."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from gpulens.checks import read
from gpulens.notify.addresses import Recipients
from gpulens.notify.channels import ChannelError, Email, Webhook, channels
from gpulens.notify.config import Config, ConfigError, SmtpSettings, WebhookSettings
from tests.agent.webcerts import Pki
from tests.notify.servers import not_smtp_server, smtp_server, webhook_server
from tests.tools import free_port

ALICE = Recipients(emails=("alice@example.org",), handles=("@alice",))


def smtp(port: int, **keys: Any) -> SmtpSettings:
    document = {"host": "127.0.0.1", "port": port, "security": "none", "from": "gpulens <gpulens@example.org>"}
    document["timeout"] = "5s"  # a test that hangs fails in seconds
    return read({**document, **keys}, "smtp", SmtpSettings)


@pytest.fixture
def pki(tmp_path):
    return Pki.make(tmp_path)


def test_plain_smtp_delivers_the_message_with_its_headers_and_body():
    with smtp_server() as box:
        Email(smtp(box.port)).deliver(
            Recipients(emails=("alice@example.org", "bob@example.org")), "Your job 1234", "Hello Alice,\n\nDone.\n"
        )
    [got] = box.received
    assert got.sender == "gpulens@example.org"
    assert got.recipients == ["alice@example.org", "bob@example.org"]
    assert got.mail["To"] == "alice@example.org, bob@example.org"
    assert got.mail["From"] == "gpulens <gpulens@example.org>"
    assert got.mail["Subject"] == "Your job 1234"
    assert got.mail["Auto-Submitted"] == "auto-generated"
    assert got.mail["Message-ID"].endswith("@example.org>")
    assert got.body == "Hello Alice,\n\nDone.\n"


def test_a_recipient_the_server_refuses_is_said_and_the_others_get_the_mail():
    """smtplib returns the recipients refused beside others taken: they were counted as reached."""
    both = Recipients(emails=("alice@example.org", "gone@example.org"))
    with smtp_server() as box:
        box.refuse["gone@example.org"] = "550 5.1.1 no such user"
        refused = Email(smtp(box.port)).deliver(both, "Your job 1234", "Hello\n")
        assert refused.recipients == ("gone@example.org",)
        assert refused.problem == (
            f"SMTP server 127.0.0.1:{box.port} refused gone@example.org: 550 5.1.1 no such user; check those "
            "addresses (the others were sent)"
        )
        box.refuse["alice@example.org"] = "451 4.7.1 try again later"
        box.refuse["gone@example.org"] = "452 4.2.2 mailbox full"
        with pytest.raises(ChannelError, match="put off every recipient for now .alice@example.org: 451 "):
            Email(smtp(box.port)).deliver(both, "Your job 1234", "Hello\n")
    assert [got.recipients for got in box.received] == [["alice@example.org"]]


def test_starttls_with_a_login_over_a_certificate_the_given_ca_signed(pki, tmp_path):
    (tmp_path / "password").write_text("s3cret\n")
    with smtp_server(starttls=pki.server_context(), users={"gpulens": "s3cret"}) as box:
        settings = read(
            {"host": "127.0.0.1", "port": box.port, "from": "gpulens@example.org", "ca_file": str(pki.ca_file)}
            | {"username": "gpulens", "password_file": str(tmp_path / "password")},
            "smtp",
            SmtpSettings,
        )
        [email] = channels(Config(smtp=settings), {})
        email.deliver(ALICE, "Über GPUs", "Grüße\n")
    assert box.logins == [("gpulens", True)]
    [got] = box.received
    assert got.mail["Subject"] == "Über GPUs" and got.body == "Grüße\n"


def test_implicit_tls(pki):
    with smtp_server(tls=pki.server_context()) as box:
        Email(smtp(box.port, security="tls", ca_file=str(pki.ca_file))).deliver(ALICE, "Hi", "body\n")
    assert [r.recipients for r in box.received] == [["alice@example.org"]]


def test_a_password_the_server_refuses_is_one_line_naming_the_server_and_where_the_password_is(pki):
    with smtp_server(starttls=pki.server_context(), users={"gpulens": "s3cret"}) as box:
        email = Email(
            smtp(box.port, security="starttls", ca_file=str(pki.ca_file), username="gpulens", password_env="PW"),
            "wrong",
        )
        with pytest.raises(ChannelError) as failed:
            email.deliver(ALICE, "Hi", "body\n")
    # smtplib tries each mechanism the server offers (PLAIN, then LOGIN) before it gives up
    assert box.received == [] and set(box.logins) == {("gpulens", False)}
    said = str(failed.value)
    assert said.startswith(f"SMTP server 127.0.0.1:{box.port} refused the login of gpulens (535 ")
    assert said.endswith("check smtp.username and the password in $PW") and "\n" not in said


def test_a_certificate_no_trusted_ca_signed_names_smtp_ca_file(pki):
    with smtp_server(starttls=pki.server_context()) as box:
        with pytest.raises(ChannelError) as failed:
            Email(smtp(box.port, security="starttls")).deliver(ALICE, "Hi", "body\n")
    assert box.received == []
    assert str(failed.value) == (
        f"SMTP server 127.0.0.1:{box.port} failed the TLS handshake (unable to get local issuer certificate); "
        "give the CA that signed its certificate as smtp.ca_file"
    )


def test_a_server_without_starttls_and_one_that_is_not_there():
    with smtp_server() as box:
        with pytest.raises(ChannelError) as failed:
            Email(smtp(box.port, security="starttls")).deliver(ALICE, "Hi", "body\n")
    assert str(failed.value) == (
        f"SMTP server 127.0.0.1:{box.port} does not offer STARTTLS; set smtp.security to tls (port 465) or none, "
        "as the server expects"
    )
    port = free_port()
    with pytest.raises(ChannelError) as failed:
        Email(smtp(port)).deliver(ALICE, "Hi", "body\n")
    assert str(failed.value) == (
        f"SMTP server 127.0.0.1:{port} cannot be reached (Connection refused); check smtp.host and smtp.port"
    )
    assert failed.value.unreachable  # the sender does not try it again at once (a STARTTLS mismatch it does)


@contextlib.contextmanager
def hung_after_data() -> Iterator[int]:
    with smtp_server() as box:
        box.hang = 3.0
        yield box.port


@pytest.mark.parametrize(
    ("server", "said"),
    [
        # It never greets: smtplib said "closed the connection (Connection unexpectedly closed: timed out)".
        (lambda: not_smtp_server(None), "did not answer within 1 s while connecting; check smtp.host and smtp.port, "),
        (hung_after_data, "did not answer within 1 s while sending; check smtp.host and smtp.port, and that the "),
        # It was "answered -1 /1.1 200 OK while connecting; see the server's log".
        (
            lambda: not_smtp_server(b"HTTP/1.1 200 OK\r\n\r\n"),
            "answered what is not SMTP while connecting: it is no SMTP server; check smtp.host and smtp.port",
        ),
    ],
    ids=["hung before its greeting", "hung after DATA", "no SMTP server"],
)
def test_a_server_that_hangs_or_is_no_smtp_server_is_named_so(server, said):
    with server() as port, pytest.raises(ChannelError) as failed:
        Email(smtp(port, timeout="1s")).deliver(ALICE, "Hi", "body\n")
    assert str(failed.value).startswith(f"SMTP server 127.0.0.1:{port} {said}"), failed.value
    assert failed.value.unreachable == ("did not answer" in said), said


def test_a_ca_file_that_is_not_there_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^smtp.ca_file /nonexistent.pem: cannot be read \(No such file"):
        Email(smtp(25, ca_file="/nonexistent.pem"))


def test_the_email_channel_reaches_addresses_and_the_webhook_handles():
    both = Recipients(emails=("a@example.org",), handles=("@a",))
    assert Email(smtp(25)).reaches(both) == ("a@example.org",)
    assert Email(smtp(25)).reaches(Recipients(handles=("@a",))) == ()
    hook = Webhook(
        read({"kind": "slack", "url": "http://127.0.0.1:9/x"}, "w", WebhookSettings), "http://127.0.0.1:9/x", "w"
    )
    assert hook.reaches(both) == ("@a",) and hook.reaches(Recipients(emails=("a@example.org",))) == ()


@pytest.mark.parametrize(
    ("kind", "extra", "text", "fields"),
    [
        ("slack", {}, "@alice *Idle GPUs*\nYour job.\n", {"username": "gpulens"}),
        (
            "mattermost",
            {"channel": "gpu-jobs", "username": "gpu-bot"},
            "@alice **Idle GPUs**\nYour job.\n",
            {"channel": "gpu-jobs", "username": "gpu-bot"},
        ),
    ],
)
def test_a_webhook_posts_the_text_with_the_mentions_and_its_channel(kind, extra, text, fields):
    with webhook_server() as hooks:
        url = f"{hooks.url}/hooks/T000/B000/XXXXSECRET"
        hook = Webhook(read({"kind": kind, "url": url, **extra}, "webhooks[0]", WebhookSettings), url, "webhooks[0]")
        hook.deliver(Recipients(handles=("@alice",)), "Idle GPUs", "Your job.\n")
    assert hooks.posts == [("/hooks/T000/B000/XXXXSECRET", {"text": text, **fields})]
    assert "SECRET" not in hook.name and hook.name.endswith(f"webhook at {hooks.url}")


def test_a_webhook_that_is_gone_or_unreachable_is_one_line_without_its_secret_path():
    with webhook_server() as hooks:
        hooks.status, hooks.said = 404, "no_service"
        url = f"{hooks.url}/services/T000/B000/XXXXSECRET"
        [hook] = channels(
            Config(webhooks=(read({"kind": "slack", "url_env": "HOOK_URL"}, "w", WebhookSettings),)), {"HOOK_URL": url}
        )
        with pytest.raises(ChannelError) as failed:
            hook.deliver(ALICE, "Hi", "body\n")
    assert str(failed.value) == (
        f"Slack webhook at {hooks.url} answered HTTP 404 (no_service); the webhook is gone or its URL is wrong: "
        "make a new one and give it as webhooks[0].url"
    )
    with pytest.raises(ChannelError) as failed:  # the server has stopped
        hook.deliver(ALICE, "Hi", "body\n")
    assert str(failed.value).startswith(f"Slack webhook at {hooks.url} cannot be reached (")
    assert str(failed.value).endswith("; check webhooks[0].url") and "SECRET" not in str(failed.value)


@pytest.mark.parametrize("status", [307, 302])
def test_a_webhook_that_redirects_fails_naming_where_it_leads_by_its_host(status):
    """A 307 was followed to another host and reported as sent through the webhook; after a 302, the POST became a
    GET and the target's 501 was blamed on the webhook."""
    with webhook_server() as hooks, webhook_server() as other:
        hooks.status, hooks.location = status, f"{other.url}/services/T000/B000/OTHERSECRET?token=x"
        url = f"{hooks.url}/services/T000/B000/XXXXSECRET"
        hook = Webhook(read({"kind": "slack", "url": url}, "webhooks[0]", WebhookSettings), url, "webhooks[0]")
        with pytest.raises(ChannelError) as failed:
            hook.deliver(ALICE, "Hi", "body\n")
    assert str(failed.value) == (
        f"Slack webhook at {hooks.url} answered HTTP {status} (a redirect to {other.url}); give the final URL as "
        "webhooks[0].url"
    )
    assert other.posts == []  # the message went to no other server


def test_secrets_come_from_their_file_or_variable_and_a_missing_one_names_the_key(tmp_path):
    hook = read({"kind": "slack", "url_file": str(tmp_path / "absent")}, "w", WebhookSettings)
    with pytest.raises(ConfigError) as failed:
        channels(Config(webhooks=(hook,), source="notify.yaml"), {})
    assert str(failed.value) == (
        f"notify.yaml: webhooks[0].url_file {tmp_path / 'absent'}: cannot be read (No such file or directory); "
        "check the file and its rights"
    )
    settings = smtp(25, username="gpulens", password_env="GPULENS_SMTP_PASSWORD")
    with pytest.raises(ConfigError) as failed:
        channels(Config(smtp=settings, source="notify.yaml"), {})
    assert str(failed.value) == (
        "notify.yaml: smtp.password_env: the variable GPULENS_SMTP_PASSWORD is not set; set it, or give "
        "smtp.password_file"
    )
