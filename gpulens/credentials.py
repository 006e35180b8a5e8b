"""The credentials gpulens tools show servers, from files and the environment, never the command line
(every user of the machine can read it). Prometheus: --bearer-token-file or --basic-auth-file. Agents:

    GPULENS_AGENT_CA_FILE          PEM bundle of the CA that signed the agents' certificates (default: the system's)
    GPULENS_AGENT_CERT_FILE        client certificate (PEM) for agents that ask for one, with
    GPULENS_AGENT_KEY_FILE         its private key (PEM)
    GPULENS_AGENT_BASIC_AUTH_FILE  a file holding USER:PASSWORD, for agents with basic_auth_users
"""

from __future__ import annotations

import argparse
import os
import pathlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

CA_FILE = "GPULENS_AGENT_CA_FILE"
CERT_FILE = "GPULENS_AGENT_CERT_FILE"
KEY_FILE = "GPULENS_AGENT_KEY_FILE"
BASIC_AUTH_FILE = "GPULENS_AGENT_BASIC_AUTH_FILE"


@dataclass(frozen=True)
class Credentials:
    """What a client shows a server: a bearer token or basic auth; for HTTPS, the CA that signed the
    server's certificate (default: the system's trusted CAs) and a client certificate with its key."""

    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class AccessError(ValueError):
    """A setting for reaching agents is wrong; the message names the variable and the fix."""


def add_credential_flags(parser: argparse.ArgumentParser) -> None:
    """Add --bearer-token-file and --basic-auth-file, the Prometheus credentials of a command."""
    # One Authorization header: with both, the basic-auth one would silently replace the token.
    files = parser.add_mutually_exclusive_group()
    files.add_argument("--bearer-token-file", metavar="FILE", help="file holding a bearer token for Prometheus")
    files.add_argument("--basic-auth-file", metavar="FILE", help="file holding USER:PASSWORD for Prometheus")


def read_credentials(bearer_token_file: str | None, basic_auth_file: str | None) -> Credentials:
    """Return what the files those flags name hold; raise ValueError naming the file and the fix, not its text."""
    token = _read_text(bearer_token_file, "the bearer token file")
    return Credentials(bearer_token=token or None, basic_auth=_basic_auth(basic_auth_file, "the basic auth file"))


def _basic_auth(path: str | None, named: str) -> tuple[str, str] | None:
    text = _read_text(path, named)
    if text is None:
        return None
    user, colon, password = text.partition(":")
    if not colon:
        raise ValueError(f"{named} {path!r} must hold USER:PASSWORD on one line")
    return user, password


def _read_text(path: str | None, named: str) -> str | None:
    if not path:
        return None
    try:
        return pathlib.Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ValueError(f"cannot read {named} {path!r} ({error.strerror}); check the path") from None
    except ValueError:  # not UTF-8 text, or a NUL in the path
        raise ValueError(f"{named} {path!r} is not a text file; check the path") from None


def agent_credentials(environ: Mapping[str, str] | None = None) -> Credentials:
    """Return the agents' credentials the variables above give (default: os.environ); raise AccessError when
    one names an unreadable or malformed file, so that a bad certificate is an error now, not at a request."""
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
    try:
        context = ssl.create_default_context(cafile=files[CA_FILE])
        if files[CERT_FILE]:
            context.load_cert_chain(files[CERT_FILE], files[KEY_FILE])
    except (ssl.SSLError, OSError) as error:
        raise AccessError(
            f"{CA_FILE}/{CERT_FILE}/{KEY_FILE}: not PEM certificates and key ({error}); check the files"
        ) from None
    try:
        auth = _basic_auth(environ.get(BASIC_AUTH_FILE, "").strip(), BASIC_AUTH_FILE)
    except ValueError as error:
        raise AccessError(str(error)) from None
    return Credentials(basic_auth=auth, ca_file=files[CA_FILE], cert_file=files[CERT_FILE], key_file=files[KEY_FILE])
