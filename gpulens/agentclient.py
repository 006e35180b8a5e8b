"""How gpulens tools reach agents that require TLS or basic auth (the dashboard's agents source, reports).

Set in the environment, never on the command line, where other users of the machine could read them:

    GPULENS_AGENT_CA_FILE          PEM bundle of the CA that signed the agents' certificates
                                   (default: the system's trusted CAs)
    GPULENS_AGENT_CERT_FILE        client certificate (PEM) for agents that ask for one, with
    GPULENS_AGENT_KEY_FILE         its private key (PEM)
    GPULENS_AGENT_BASIC_AUTH_FILE  a file holding USER:PASSWORD, for agents with basic_auth_users
"""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

CA_FILE = "GPULENS_AGENT_CA_FILE"
CERT_FILE = "GPULENS_AGENT_CERT_FILE"
KEY_FILE = "GPULENS_AGENT_KEY_FILE"
BASIC_AUTH_FILE = "GPULENS_AGENT_BASIC_AUTH_FILE"


class AccessError(ValueError):
    """A setting for reaching agents is wrong; the message names the variable and the fix."""


@dataclass(frozen=True)
class AgentAccess:
    """Credentials for agents; the default (all None) is plain HTTP or HTTPS checked by the system's CAs."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    basic_auth: tuple[str, str] | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AgentAccess:
        """Read the variables above; raise AccessError when one names an unreadable or malformed file."""
        environ = os.environ if environ is None else environ
        for name in (CA_FILE, CERT_FILE, KEY_FILE, BASIC_AUTH_FILE):
            if "\0" in environ.get(name, ""):  # the system calls refuse it with a bare ValueError
                raise AccessError(f"{name}: the path has a NUL character; fix the path")
        files = {name: environ.get(name, "").strip() or None for name in (CA_FILE, CERT_FILE, KEY_FILE)}
        for name, path in files.items():
            if path is not None and not os.access(path, os.R_OK):
                raise AccessError(f"{name}: {path!r} cannot be read; fix the path")
        if (files[CERT_FILE] is None) != (files[KEY_FILE] is None):
            raise AccessError(f"{CERT_FILE} and {KEY_FILE} go together; set both or neither")
        auth = None
        path = environ.get(BASIC_AUTH_FILE, "").strip()
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read().strip()
            except (OSError, UnicodeDecodeError):
                raise AccessError(f"{BASIC_AUTH_FILE}: {path!r} cannot be read as text; fix the path") from None
            user, colon, password = text.partition(":")
            if not colon or not user:
                raise AccessError(f"{BASIC_AUTH_FILE}: {path!r} must hold USER:PASSWORD on one line")
            auth = (user, password)
        access = cls(files[CA_FILE], files[CERT_FILE], files[KEY_FILE], auth)
        access.ssl_context()  # a bad certificate is an error now, not on the first request
        return access

    def ssl_context(self) -> ssl.SSLContext:
        """Return the TLS context for https:// agents: server checked, client certificate when given."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as error:
            raise AccessError(f"{CA_FILE}/{CERT_FILE}/{KEY_FILE}: not PEM certificates and key ({error}); "
                              "check the files") from None
        return context

    def headers(self) -> dict[str, str]:
        """Return the Authorization header for basic auth, or nothing."""
        if self.basic_auth is None:
            return {}
        token = base64.b64encode(":".join(self.basic_auth).encode("utf-8")).decode("ascii")
        return {"Authorization": f"Basic {token}"}

    def requests_options(self) -> dict:
        """Return keyword arguments for `requests` (verify, cert, auth)."""
        return {
            "verify": self.ca_file or True,
            "cert": (self.cert_file, self.key_file) if self.cert_file else None,
            "auth": self.basic_auth,
        }
