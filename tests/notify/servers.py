"""Real servers on loopback for the notify tests: an SMTP server (aiosmtpd: plain, STARTTLS or implicit TLS,
with logins), and an HTTP server that takes webhooks the way Slack and Mattermost do."""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import json
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.tools import free_port


@dataclass
class Received:
    sender: str
    recipients: list[str]
    mail: EmailMessage

    @property
    def body(self) -> str:
        part = self.mail.get_body(("plain",))
        assert part is not None, self.mail
        return cast(EmailMessage, part).get_content().replace("\r\n", "\n")  # as sent: SMTP carries CRLF


@dataclass
class Mailbox:
    """What the server received, and the logins it was offered."""

    received: list[Received] = field(default_factory=list)
    logins: list[tuple[str, bool]] = field(default_factory=list)  # (user, accepted)
    port: int = 0
    hang: float = 0.0  # seconds it takes to answer a message's data: a server hung after DATA
    refuse: dict[str, str] = field(default_factory=dict)  # recipient -> the reply that refuses it ("550 ...")

    async def handle_RCPT(  # noqa: N802 - aiosmtpd's name
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        await asyncio.sleep(self.hang)
        mail = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), cast(EmailMessage, mail)))
        return "250 OK"


@contextlib.contextmanager
def smtp_server(
    starttls: ssl.SSLContext | None = None,
    tls: ssl.SSLContext | None = None,
    users: Mapping[str, str] | None = None,
) -> Iterator[Mailbox]:
    """An SMTP server on 127.0.0.1: plain, offering STARTTLS (required) with `starttls`, speaking TLS from the
    first byte with `tls`; with `users`, it takes only mail from a client logged in as one of them."""
    box = Mailbox()

    def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        login = data.login.decode() if isinstance(data, LoginPassword) else ""
        accepted = isinstance(data, LoginPassword) and (users or {}).get(login) == data.password.decode()
        box.logins.append((login, accepted))
        return AuthResult(success=accepted, handled=False)  # not handled: the server answers 535 itself

    options: dict[str, Any] = {}
    if starttls is not None:
        options.update(tls_context=starttls, require_starttls=True)
    if users is not None:
        options.update(authenticator=authenticator, auth_required=True, auth_require_tls=bool(starttls or tls))
    for attempt in range(5):  # free_port's port may be taken before the server binds it, by another suite
        box.port = free_port()
        controller = Controller(box, hostname="127.0.0.1", port=box.port, ssl_context=tls, **options)
        try:
            controller.start()
            break
        except OSError:
            if attempt == 4:
                raise
    try:
        yield box
    finally:
        controller.stop()


@dataclass
class Hooks:
    """The webhook posts a server received: (path, JSON body); it answers each with `status` and `said`, and a
    `location` header where one is given (a redirect)."""

    url: str = ""
    posts: list[tuple[str, Any]] = field(default_factory=list)
    status: int = 200
    said: str = "ok"
    location: str = ""


@contextlib.contextmanager
def webhook_server() -> Iterator[Hooks]:
    hooks = Hooks()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hooks.posts.append((self.path, json.loads(body)))
            answer = hooks.said.encode()
            self.send_response(hooks.status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(answer)))
            if hooks.location:
                self.send_header("Location", hooks.location)
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hooks.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hooks
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def not_smtp_server(greeting: bytes | None) -> Iterator[int]:
    """A server on 127.0.0.1 that is no SMTP server: it greets each client with `greeting` and says no more; with
    None, it takes connections and never answers, as a server hung. Its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    clients: list[socket.socket] = []

    def greet() -> None:
        with contextlib.suppress(OSError):  # closed: the test is over
            while True:
                client, _ = listener.accept()
                clients.append(client)
                client.sendall(greeting or b"")

    thread = threading.Thread(target=greet, daemon=True)
    if greeting is not None:
        thread.start()  # else connections wait in the backlog, never answered
    try:
        yield listener.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() waiting in the thread, as close() does not
        listener.close()
        for client in clients:
            client.close()
        if greeting is not None:
            thread.join()


def digest_settings(folder: Path, port: int) -> str:
    """Notify settings in `folder` that mail each user at example.org, and the climate account's lead at their own
    address, through the SMTP server at `port`; their path."""
    (folder / "owners.yaml").write_text("accounts:\n  climate: {lead: pi@climate.example.org}\n")
    path = folder / "notify.yaml"
    path.write_text(
        f"smtp: {{host: 127.0.0.1, port: {port}, security: none, from: gpulens@example.org, timeout: 5s}}\n"
        f"addresses: {{map_file: {folder / 'owners.yaml'}, gecos: false, domain_template: '{{user}}@example.org'}}\n"
        f"state: {folder / 'state'}\n"
    )
    return str(path)
