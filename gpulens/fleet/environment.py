"""Where the dashboard reads from: one `Source` interface, a Prometheus and an agents implementation.

`from_environment` builds the configured source from the variables `gpulens dashboard` sets:

    GPULENS_DASHBOARD_PROMETHEUS      URL of a Prometheus-compatible server, or
    GPULENS_DASHBOARD_AGENTS          agent URLs, comma-separated, each optionally NAME=URL
    GPULENS_DASHBOARD_ALERTMANAGER    optional Alertmanager URL (with Prometheus): silences and inhibitions
    GPULENS_PROMETHEUS_BEARER_TOKEN   optional bearer token for the server
    GPULENS_PROMETHEUS_BASIC_AUTH     optional USER:PASSWORD for the server
    GPULENS_PROMETHEUS_CA_FILE        optional PEM bundle of the CA that signed the server's certificate
                                      (default: the system's trusted CAs)
    GPULENS_PROMETHEUS_CERT_FILE      optional client certificate (PEM) for the server, with
    GPULENS_PROMETHEUS_KEY_FILE       its private key (PEM, unencrypted)
    GPULENS_ALERTMANAGER_CA_FILE      the same three for Alertmanager: its own, as Prometheus' CA, client
    GPULENS_ALERTMANAGER_CERT_FILE    certificate, token and password are not for another server
    GPULENS_ALERTMANAGER_KEY_FILE
    GPULENS_AGENT_*                   TLS and basic auth for agents (gpulens/credentials.py)
"""

from __future__ import annotations

import argparse
import functools
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import replace

from gpulens.credentials import (
    BASIC_AUTH_FILE,
    AccessError,
    Credentials,
    add_credential_flags,
    agent_credentials,
    misplaced_flags,
    read_credentials,
    tls_credentials,
)
from gpulens.errors import converted
from gpulens.fleet.agents import AgentsSource, fetch_metrics
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.records import Answer, Source, SourceProblem
from gpulens.urls import URL_EXAMPLES, flag_url, refuse_password

__all__ = [
    "ALERTMANAGER",
    "AgentsSource",
    "Answer",
    "ConfigError",
    "PrometheusSource",
    "Source",
    "SourceProblem",
    "add_source_flags",
    "from_environment",
    "parse_agents",
    "source_environment",
    "tls_environment",
]

PROMETHEUS = "GPULENS_DASHBOARD_PROMETHEUS"
AGENTS = "GPULENS_DASHBOARD_AGENTS"
ALERTMANAGER = "GPULENS_DASHBOARD_ALERTMANAGER"
BEARER_TOKEN = "GPULENS_PROMETHEUS_BEARER_TOKEN"
BASIC_AUTH = "GPULENS_PROMETHEUS_BASIC_AUTH"
# Paths, set by `gpulens dashboard` from --ca-file, --cert-file, --key-file and their --alertmanager-* twins.
PROMETHEUS_TLS = ("GPULENS_PROMETHEUS_CA_FILE", "GPULENS_PROMETHEUS_CERT_FILE", "GPULENS_PROMETHEUS_KEY_FILE")
ALERTMANAGER_TLS = ("GPULENS_ALERTMANAGER_CA_FILE", "GPULENS_ALERTMANAGER_CERT_FILE", "GPULENS_ALERTMANAGER_KEY_FILE")


class ConfigError(ValueError):
    """The configured source cannot be built; the message says what to fix."""


def parse_agents(text: str) -> dict[str, str]:
    """Return {node name: agent URL} from 'URL[,URL...]' where each URL may be written NAME=URL.

    A URL without a name is named by its host:port. Raises ConfigError with the fix.
    """
    agents: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, eq, url = item.partition("=")
        if not eq or "://" in name:
            name, url = "", item
        try:  # also a port that is not a number, or an unclosed '[' of an IPv6 address
            url = flag_url(url, "agent URL", URL_EXAMPLES["--agents"])
        except ValueError as error:
            raise ConfigError(str(error)) from None
        name = name.strip() or urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
        if name in agents:
            raise ConfigError(f"agent name {name!r} is given twice; name each agent once (NAME=URL)")
        agents[name] = url
    if not agents:
        raise ConfigError("no agent URL given; write e.g. --agents http://127.0.0.1:10906")
    return agents


def _tls(environ: Mapping[str, str], names: tuple[str, str, str], whose: str) -> Credentials:
    """Return the TLS files the variables `names` (CA, certificate, key) give, as tls_credentials checks them."""
    ca_file, cert_file, key_file = (environ.get(name) for name in names)
    return tls_credentials(ca_file, cert_file, key_file, names, whose)


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags that name what a command reads the fleet from: --prometheus URL or --agents URL,...,
    with Prometheus' credentials and TLS files (the agents' come from GPULENS_AGENT_*)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="a Prometheus-compatible server (Thanos, Mimir, ...)")
    source.add_argument("--agents", metavar="URL[,URL...]", help="agents read directly; each may be NAME=URL")
    add_credential_flags(parser)


def tls_environment(names: tuple[str, str, str], tls: Credentials | None) -> dict[str, str]:
    """Return the variables `names` (CA, certificate, key) set to the absolute paths of the files `tls` gives,
    blank where none: a child process reads them, and variables from the caller's environment do not."""
    paths = (tls.ca_file, tls.cert_file, tls.key_file) if tls else (None, None, None)
    return {name: os.path.abspath(path) if path else "" for name, path in zip(names, paths, strict=True)}


def source_environment(args: argparse.Namespace) -> dict[str, str]:
    """Return the variables `from_environment` reads for the source the flags `add_source_flags` added name
    (in `args`); raise ConfigError with the fix. A wrong certificate or password file is an error now, not a
    problem at every read."""
    misplaced = misplaced_flags(args) if args.agents is not None else None
    if misplaced:
        raise ConfigError(misplaced)
    env = {PROMETHEUS: "", AGENTS: "", BEARER_TOKEN: "", BASIC_AUTH: "", **tls_environment(PROMETHEUS_TLS, None)}
    if args.prometheus is not None:  # '' too: a mistake, not a missing flag
        with converted(ValueError, ConfigError):
            env[PROMETHEUS] = flag_url(args.prometheus, "--prometheus", URL_EXAMPLES["--prometheus"])
        with converted(ValueError, ConfigError):  # AccessError too
            refuse_password(args.prometheus, "--prometheus", "pass --basic-auth-file FILE holding USER:PASSWORD")
            credentials = read_credentials(args)
        env[BEARER_TOKEN] = credentials.bearer_token or ""
        env[BASIC_AUTH] = ":".join(credentials.basic_auth or ())
        env.update(tls_environment(PROMETHEUS_TLS, credentials))
        return env
    with converted(ValueError, ConfigError, "--agents: "):
        agents = parse_agents(args.agents or "")
    with converted(ValueError, ConfigError):
        for agent in agents.values():
            refuse_password(agent, "--agents", f"put USER:PASSWORD in a file named by {BASIC_AUTH_FILE}")
        agent_credentials()
    env[AGENTS] = args.agents
    return env


def from_environment(environ: Mapping[str, str]) -> Source:
    """Return the source the environment configures; raise ConfigError naming the variable to set."""
    prometheus, agents = environ.get(PROMETHEUS, "").strip(), environ.get(AGENTS, "").strip()
    if prometheus and agents:
        raise ConfigError(f"both {PROMETHEUS} and {AGENTS} are set; choose one source")
    if prometheus:
        auth = environ.get(BASIC_AUTH, "")
        user, colon, password = auth.partition(":")
        if auth and not colon:
            raise ConfigError(f"{BASIC_AUTH} must be USER:PASSWORD")
        if auth and environ.get(BEARER_TOKEN):
            raise ConfigError(f"both {BEARER_TOKEN} and {BASIC_AUTH} are set; Prometheus takes one, keep one")
        alertmanager = environ.get(ALERTMANAGER, "").strip()
        with converted(ValueError, ConfigError):  # AccessError too
            tls = _tls(environ, PROMETHEUS_TLS, "Prometheus'")
            alertmanager_tls = _tls(environ, ALERTMANAGER_TLS, "Alertmanager's") if alertmanager else None
            return PrometheusSource.from_url(
                prometheus,
                replace(
                    tls, bearer_token=environ.get(BEARER_TOKEN) or None, basic_auth=(user, password) if auth else None
                ),
                alertmanager=alertmanager,
                alertmanager_tls=alertmanager_tls,
            )
    if environ.get(ALERTMANAGER, "").strip():
        raise ConfigError(
            f"{ALERTMANAGER} needs Prometheus: alerts come from Prometheus' rules; "
            f"set {PROMETHEUS} too, or unset {ALERTMANAGER}"
        )
    if agents:
        with converted(AccessError, ConfigError):
            credentials = agent_credentials(environ)
        return AgentsSource(
            parse_agents(agents),
            fetch=functools.partial(fetch_metrics, credentials=credentials),
            credentials=credentials,
        )
    raise ConfigError(
        f"no source configured: start the dashboard with 'gpulens dashboard --prometheus URL' or "
        f"'--agents URL' (or set {PROMETHEUS} or {AGENTS})"
    )
