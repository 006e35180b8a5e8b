"""The credentials gpulens tools show servers, from files and the environment, never the command line
(every user of the machine can read it). Prometheus: --bearer-token-file or --basic-auth-file, and for HTTPS
--ca-file, --cert-file and --key-file (Alertmanager, read by the dashboard, has TLS files of its own). Agents:

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
from dataclasses import dataclass, replace

from gpulens.errors import converted

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
    """Add --bearer-token-file and --basic-auth-file, the Prometheus credentials of a command, and its TLS
    files --ca-file, --cert-file and --key-file."""
    # One Authorization header: with both, the basic-auth one would silently replace the token.
    files = parser.add_mutually_exclusive_group()
    files.add_argument("--bearer-token-file", metavar="FILE", help="file holding a bearer token for Prometheus")
    files.add_argument("--basic-auth-file", metavar="FILE", help="file holding USER:PASSWORD for Prometheus")
    add_tls_flags(parser, "", "Prometheus")


def add_tls_flags(parser: argparse.ArgumentParser, prefix: str, server: str) -> None:
    """Add --PREFIXca-file, --PREFIXcert-file and --PREFIXkey-file: how a command checks the HTTPS certificate
    of `server`, and the client certificate it shows it. Paths only: they may go on a command line."""
    parser.add_argument(
        f"--{prefix}ca-file",
        metavar="FILE",
        help=f"PEM bundle of the CA that signed the certificate of {server}, trusted in place of the system's CAs",
    )
    parser.add_argument(
        f"--{prefix}cert-file",
        metavar="FILE",
        help=f"client certificate (PEM) to show {server} where it asks for one, with --{prefix}key-file",
    )
    parser.add_argument(f"--{prefix}key-file", metavar="FILE", help="the client certificate's key (PEM, unencrypted)")


def tls_flags(prefix: str = "") -> tuple[str, str, str]:
    """Return the names of the flags `add_tls_flags` adds with `prefix`: CA, certificate, key."""
    return f"--{prefix}ca-file", f"--{prefix}cert-file", f"--{prefix}key-file"


def misplaced_flags(args: argparse.Namespace) -> str | None:
    """Return the usage error for the flags `add_credential_flags` added, given (in `args`) to a command
    reading agents, which read theirs from GPULENS_AGENT_*; None when none is given."""
    if args.bearer_token_file or args.basic_auth_file:
        return (
            "--bearer-token-file and --basic-auth-file are for --prometheus; agents read their "
            f"credentials from {BASIC_AUTH_FILE}"
        )
    files = (args.ca_file, args.cert_file, args.key_file)
    given = [flag for flag, value in zip(tls_flags(), files, strict=True) if value]
    if given:
        return (
            f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for --prometheus; agents read their "
            f"TLS files from {CA_FILE}, {CERT_FILE} and {KEY_FILE}"
        )
    return None


def read_credentials(args: argparse.Namespace) -> Credentials:
    """Return what the files the flags `add_credential_flags` added name (in `args`) hold; raise ValueError
    naming the flag or file and the fix, not its text."""
    token = _read_text(args.bearer_token_file, "the bearer token file")
    basic_auth = _basic_auth(args.basic_auth_file, "the basic auth file")
    tls = tls_credentials(args.ca_file, args.cert_file, args.key_file, tls_flags(), "Prometheus'")
    return replace(tls, bearer_token=token or None, basic_auth=basic_auth)


def tls_credentials(
    ca_file: str | None, cert_file: str | None, key_file: str | None, names: tuple[str, str, str], whose: str
) -> Credentials:
    """Return the TLS files given (blank: not given) as Credentials; raise AccessError naming the flag or
    variable (`names`: CA, certificate, key) and the fix, so that a wrong file is an error now, not at the
    first request. `whose` names the server's certificate in the fix: "Prometheus'", "the agents'"."""
    paths = [(path or "").strip() or None for path in (ca_file, cert_file, key_file)]
    for name, path in zip(names, paths, strict=True):
        if path is not None and "\0" in path:  # the system calls refuse it with a bare ValueError
            raise AccessError(f"{name}: the path has a NUL character; fix the path")
        if path is not None and not os.access(path, os.R_OK):
            raise AccessError(f"{name}: {path!r} cannot be read; fix the path")
    ca, cert, key = paths
    (ca_name, cert_name, key_name) = names
    if (cert is None) != (key is None):
        raise AccessError(f"{cert_name} and {key_name} go together; give both or neither")
    if ca is not None:
        try:
            ssl.create_default_context(cafile=ca)
        except (ssl.SSLError, OSError) as error:
            raise AccessError(
                f"{ca_name}: {ca!r} is not PEM certificates ({_ssl_reason(error)}); give the PEM bundle of the "
                f"CA that signed {whose} certificate"
            ) from None
    if cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:  # the certificate alone, so that a wrong file is named as such
            context.load_verify_locations(cafile=cert)
        except (ssl.SSLError, OSError) as error:
            raise AccessError(
                f"{cert_name}: {cert!r} is not a PEM certificate ({_ssl_reason(error)}); give the client "
                "certificate in PEM"
            ) from None
        try:
            context.load_cert_chain(cert, key, password=_no_password)
        except _Encrypted:
            # Nobody is there to type its password: every request would fail (requests refuses such a key).
            raise AccessError(
                f"{key_name}: {key!r} is an encrypted key; give it unencrypted (openssl pkey -in KEY -out "
                "FILE), in a file only this user reads"
            ) from None
        except (ssl.SSLError, OSError) as error:
            reason = _ssl_reason(error)
            if "KEY_VALUES_MISMATCH" in reason.upper().replace(" ", "_"):
                raise AccessError(
                    f"{key_name}: {key!r} is not the key of the certificate in {cert_name}; give the key that "
                    "goes with it"
                ) from None
            raise AccessError(
                f"{key_name}: {key!r} is not a PEM private key ({reason}); give the client certificate's key in PEM"
            ) from None
    return Credentials(ca_file=ca, cert_file=cert, key_file=key)


class _Encrypted(Exception):
    """The key file is encrypted: loading it asked for its password."""


def _no_password() -> bytes:
    raise _Encrypted


def _ssl_reason(error: BaseException) -> str:
    """Return an SSL or OS error in one line, without the location in CPython's source."""
    text = " ".join(str(getattr(error, "strerror", None) or error).split())
    return text.split(" (_ssl.c:")[0][:200]


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
    tls = tls_credentials(
        environ.get(CA_FILE),
        environ.get(CERT_FILE),
        environ.get(KEY_FILE),
        (CA_FILE, CERT_FILE, KEY_FILE),
        "the agents'",
    )
    return replace(tls, basic_auth=basic_auth_file(environ.get(BASIC_AUTH_FILE), BASIC_AUTH_FILE))


def basic_auth_file(path: str | None, name: str) -> tuple[str, str] | None:
    """Return the (user, password) the file at `path` holds as USER:PASSWORD, None for no path (blank); raise
    AccessError naming `name` (the flag or variable that gave the path) and the fix."""
    path = (path or "").strip()
    if "\0" in path:  # the system calls refuse it with a bare ValueError
        raise AccessError(f"{name}: the path has a NUL character; fix the path")
    with converted(ValueError, AccessError):
        return _basic_auth(path, name)
