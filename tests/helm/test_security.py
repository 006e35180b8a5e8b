"""The chart's locked doors and least privilege, rendered by the real helm.

The agent's web config (a Secret mounted read-only, `--web.config.file`, HTTPS probes, a ServiceMonitor
scraping https with basic auth), the dashboard's login and its Prometheus' CA and client certificate, and
for every case the chart renders: no
privileged container, every capability dropped, no service account token, no host namespace or host
path beyond the ones docs/security.md justifies.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.helm.test_chart import (
    CASES,
    CHART,
    ROOT,
    _agent,
    _helm,
    _kinds,
    _lint,
    _template,
    _validate,
    _values_file,
)

WEB_SECRET = "gpulens-agent-web"
SCRAPE_AUTH = {
    "username": {"name": "gpulens-scrape", "key": "username"},
    "password": {"name": "gpulens-scrape", "key": "password"},
}
SCRAPE_TLS = {"ca": {"secret": {"name": "gpulens-agent-ca", "key": "ca.crt"}}, "serverName": "gpulens-agent"}
# The dashboard's Prometheus behind an internal CA, asking for a client certificate.
PROMETHEUS_TLS = {
    "ca": {"configMap": {"name": "internal-ca", "key": "ca.crt"}},
    "cert": {"secret": {"name": "gpulens-dashboard-client", "key": "tls.crt"}},
    "keySecret": {"name": "gpulens-dashboard-client", "key": "tls.key"},
}

LOCKED: dict[str, dict] = {
    # TLS and basic auth on the agents, Prometheus scraping them with both; a login on the dashboard.
    "locked": {
        "agent": {"webConfig": {"existingSecret": WEB_SECRET, "tls": True}},
        "serviceMonitor": {"tlsConfig": SCRAPE_TLS, "basicAuth": SCRAPE_AUTH},
        "dashboard": {
            "prometheus": {"basicAuthSecret": {"name": "prometheus-reader", "key": "basic-auth"}},
            "auth": {
                "existingSecret": "gpulens-dashboard-login",
                "allowedEmails": ["ada@example.org"],
                "allowedDomains": ["research.example.org"],
            },
        },
    },
    # Client certificates required: the kubelet has none, so the probes only connect.
    "mtls": {
        "agent": {"webConfig": {"existingSecret": WEB_SECRET, "tls": True, "requireClientCert": True}},
        "serviceMonitor": {
            "tlsConfig": {
                **SCRAPE_TLS,
                "cert": {"secret": {"name": "prom-client", "key": "tls.crt"}},
                "keySecret": {"name": "prom-client", "key": "tls.key"},
            }
        },
    },
    # The dashboard reads a Prometheus whose certificate an internal CA signed, with a client certificate
    # and a token; or with only the CA, from a Secret.
    "prometheus-tls": {
        "dashboard": {
            "prometheus": {
                "url": "https://prometheus.monitoring.svc:9090",
                "bearerTokenSecret": {"name": "prometheus-reader", "key": "token"},
                "tlsConfig": PROMETHEUS_TLS,
            }
        }
    },
    "prometheus-ca": {
        "dashboard": {
            "prometheus": {
                "url": "https://prometheus.monitoring.svc:9090",
                "tlsConfig": {"ca": {"secret": {"name": "corp-ca", "key": "ca.pem"}}},
            }
        }
    },
    # Alertmanager behind its own CA, asking for a client certificate; Prometheus over plain HTTP.
    "alertmanager-tls": {
        "dashboard": {
            "alertmanager": {
                "url": "https://alertmanager.monitoring.svc:9093",
                "tlsConfig": {
                    "ca": {"secret": {"name": "alerting-ca", "key": "ca.pem"}},
                    "cert": {"secret": {"name": "gpulens-am-client", "key": "tls.crt"}},
                    "keySecret": {"name": "gpulens-am-client", "key": "tls.key"},
                },
            }
        }
    },
    # Basic auth over plain HTTP (TLS terminated elsewhere, or a lab).
    "basic-auth-only": {
        "agent": {"webConfig": {"existingSecret": WEB_SECRET}},
        "serviceMonitor": {"basicAuth": SCRAPE_AUTH},
    },
}
ALL_CASES = {**CASES, **LOCKED}
# The host paths docs/security.md justifies, and whether the agent may write there.
HOST_PATHS = {
    "/var/lib/kubelet/pod-resources": True,
    "/sys/fs/cgroup": True,
    "/run/gpulens": False,
    "/var/lib/gpulens": False,
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    return {name: _template(tmp_path_factory.mktemp(name), values) for name, values in ALL_CASES.items()}


def _pods(docs: list[dict]) -> list[tuple[str, dict]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] in ("DaemonSet", "Deployment")
    ]


def _dashboard(docs: list[dict]) -> tuple[dict, dict]:
    pod = _kinds(docs)["Deployment"][0]["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_the_new_cases_lint_and_validate(rendered, tmp_path):
    for name, values in LOCKED.items():
        _lint(tmp_path, name, values)
        _validate(rendered[name], skip=("ServiceMonitor", "PrometheusRule"))


# -- the agent's web config -----------------------------------------------------------------------


def test_the_web_config_secret_is_mounted_read_only_and_passed_to_the_agent(rendered):
    pod, container = _agent(rendered["locked"])
    volume = next(v for v in pod["volumes"] if v["name"] == "web-config")
    assert volume["secret"] == {"secretName": WEB_SECRET, "defaultMode": 0o400}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "web-config")
    assert mount == {"name": "web-config", "mountPath": "/etc/gpulens/web", "readOnly": True}
    assert "--web.config.file=/etc/gpulens/web/web-config.yml" in container["args"]


def test_the_agent_accepts_the_web_config_flag():
    from gpulens.agent import config

    assert (
        config.load(["--web.config.file=/etc/gpulens/web/web-config.yml"], environ={}).web_config_file
        == "/etc/gpulens/web/web-config.yml"
    )


def test_without_a_web_config_nothing_is_mounted_and_the_probes_use_http(rendered):
    pod, container = _agent(rendered["defaults"])
    assert "web-config" not in {v["name"] for v in pod["volumes"]}
    assert [a for a in container["args"] if a.startswith("--web.config.file")] == ["--web.config.file="]  # none
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}


def test_with_tls_the_probes_use_https_on_the_open_healthz(rendered):
    _, container = _agent(rendered["locked"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    _, container = _agent(rendered["basic-auth-only"])
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTP"


def test_with_client_certificates_required_the_probes_only_connect(rendered):
    _, container = _agent(rendered["mtls"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "metrics"} and "httpGet" not in container[probe]


def test_the_service_monitor_scrapes_https_with_the_configured_tls_and_basic_auth(rendered):
    endpoint = _kinds(rendered["locked"])["ServiceMonitor"][0]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == SCRAPE_TLS
    assert endpoint["basicAuth"] == SCRAPE_AUTH
    endpoint = _kinds(rendered["basic-auth-only"])["ServiceMonitor"][0]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "http" and endpoint["basicAuth"] == SCRAPE_AUTH and "tlsConfig" not in endpoint
    endpoint = _kinds(rendered["defaults"])["ServiceMonitor"][0]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint and "basicAuth" not in endpoint


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"agent": {"webConfig": {"tls": True}}}, "set agent.webConfig.existingSecret"),
        (
            {"agent": {"webConfig": {"existingSecret": WEB_SECRET, "requireClientCert": True}}},
            "requireClientCert needs TLS",
        ),
        (
            {"dashboard": {"prometheus": {"bearerTokenSecret": {"name": "a"}, "basicAuthSecret": {"name": "b"}}}},
            "not both",
        ),
        (
            {"dashboard": {"prometheus": {"tlsConfig": {"cert": PROMETHEUS_TLS["cert"]}}}},
            "dashboard.prometheus.tlsConfig: cert and keySecret go together",
        ),
        (
            {"dashboard": {"prometheus": {"tlsConfig": {"keySecret": PROMETHEUS_TLS["keySecret"]}}}},
            "dashboard.prometheus.tlsConfig: cert and keySecret go together",
        ),
        (
            {"dashboard": {"prometheus": {"tlsConfig": {"ca": {**PROMETHEUS_TLS["ca"], **PROMETHEUS_TLS["cert"]}}}}},
            "dashboard.prometheus.tlsConfig.ca",
        ),
        ({"dashboard": {"prometheus": {"tlsConfig": {"insecureSkipVerify": True}}}}, "insecureSkipVerify"),
        (
            {"dashboard": {"alertmanager": {"url": "https://am:9093", "tlsConfig": {"cert": PROMETHEUS_TLS["cert"]}}}},
            "dashboard.alertmanager.tlsConfig: cert and keySecret go together",
        ),
        (
            {"dashboard": {"alertmanager": {"tlsConfig": {"ca": PROMETHEUS_TLS["ca"]}}}},
            "dashboard.alertmanager.tlsConfig needs dashboard.alertmanager.url",
        ),
        ({"dashboard": {"alertmanager": {"url": "alertmanager:9093"}}}, "dashboard.alertmanager.url"),
        ({"serviceMonitor": {"basicAuth": {"user": {"name": "s", "key": "u"}}}}, "serviceMonitor.basicAuth"),
        ({"dashboard": {"auth": {"allowedEmails": ["not-an-address"]}}}, "dashboard.auth.allowedEmails"),
        # Without a login the dashboard could not apply the list and would show nothing.
        (
            {"dashboard": {"auth": {"allowedDomains": ["example.org"]}}},
            "need a login: set dashboard.auth.existingSecret",
        ),
    ],
)
def test_a_web_config_mistake_is_named(tmp_path, values, said):
    result = subprocess.run(
        [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert said in result.stderr, result.stderr


# -- the dashboard ---------------------------------------------------------------------------------


def test_the_dashboard_login_and_credentials_come_from_secrets(rendered):
    pod, container = _dashboard(rendered["locked"])
    assert "--auth-file=/etc/gpulens/dashboard-auth/secrets.toml" in container["args"]
    assert "--basic-auth-file=/etc/gpulens/prometheus/basic-auth" in container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["auth"]["secret"] == {
        "secretName": "gpulens-dashboard-login",
        "defaultMode": 0o440,
        "items": [{"key": "secrets.toml", "path": "secrets.toml"}],
    }
    assert volumes["prometheus-credentials"]["secret"] == {"secretName": "prometheus-reader", "defaultMode": 0o440}
    # 0440 reaches the dashboard's uid 10001 only through the group the kubelet gives the files (fsGroup).
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 10001
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["auth"]["readOnly"] and mounts["prometheus-credentials"]["readOnly"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPULENS_DASHBOARD_ALLOWED_EMAILS"] == "ada@example.org"
    assert env["GPULENS_DASHBOARD_ALLOWED_DOMAINS"] == "research.example.org"
    # No secret's value is ever in the manifest: only files the pod reads.
    assert not any(a.startswith(("--bearer-token=", "--password")) for a in container["args"])
    pod, container = _dashboard(rendered["defaults"])
    assert not any(a.startswith("--auth-file") for a in container["args"])
    assert not any(e["name"].startswith("GPULENS_DASHBOARD_ALLOWED") for e in container["env"])


def test_the_prometheus_ca_and_client_certificate_are_mounted_read_only_and_passed(rendered):
    pod, container = _dashboard(rendered["prometheus-tls"])
    folder = "/etc/gpulens/prometheus-tls"
    for flag, name in (("--ca-file", "ca.crt"), ("--cert-file", "tls.crt"), ("--key-file", "tls.key")):
        assert f"{flag}={folder}/{name}" in container["args"]
    assert "--bearer-token-file=/etc/gpulens/prometheus/token" in container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # One folder for the three files, from a ConfigMap and a Secret; the key is a secret: 0440, for the
    # dashboard's group (fsGroup) only.
    assert volumes["prometheus-tls"]["projected"] == {
        "defaultMode": 0o440,
        "sources": [
            {"configMap": {"name": "internal-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"secret": {"name": "gpulens-dashboard-client", "items": [{"key": "tls.crt", "path": "tls.crt"}]}},
            {"secret": {"name": "gpulens-dashboard-client", "items": [{"key": "tls.key", "path": "tls.key"}]}},
        ],
    }
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 10001
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-tls"] == {"name": "prometheus-tls", "mountPath": folder, "readOnly": True}
    pod, container = _dashboard(rendered["prometheus-ca"])
    assert f"--ca-file={folder}/ca.crt" in container["args"]
    assert not any(a.startswith(("--cert-file", "--key-file")) for a in container["args"])
    assert {v["name"]: v for v in pod["volumes"]}["prometheus-tls"]["projected"]["sources"] == [
        {"secret": {"name": "corp-ca", "items": [{"key": "ca.pem", "path": "ca.crt"}]}}
    ]
    pod, container = _dashboard(rendered["defaults"])
    assert "prometheus-tls" not in {v["name"] for v in pod["volumes"]}
    assert not any(a.startswith(("--ca-file", "--cert-file", "--key-file")) for a in container["args"])


def test_the_alertmanager_and_its_own_tls_files_are_passed_beside_prometheus(rendered):
    pod, container = _dashboard(rendered["alertmanager-tls"])
    folder = "/etc/gpulens/alertmanager-tls"
    assert "--alertmanager=https://alertmanager.monitoring.svc:9093" in container["args"]
    for flag, name in (("ca-file", "ca.crt"), ("cert-file", "tls.crt"), ("key-file", "tls.key")):
        assert f"--alertmanager-{flag}={folder}/{name}" in container["args"]
    # Prometheus' own files are not involved: its URL is plain HTTP here.
    assert not any(a.startswith(("--ca-file", "--cert-file", "--key-file")) for a in container["args"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "prometheus-tls" not in volumes
    assert volumes["alertmanager-tls"]["projected"] == {
        "defaultMode": 0o440,
        "sources": [
            {"secret": {"name": "alerting-ca", "items": [{"key": "ca.pem", "path": "ca.crt"}]}},
            {"secret": {"name": "gpulens-am-client", "items": [{"key": "tls.crt", "path": "tls.crt"}]}},
            {"secret": {"name": "gpulens-am-client", "items": [{"key": "tls.key", "path": "tls.key"}]}},
        ],
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["alertmanager-tls"] == {"name": "alertmanager-tls", "mountPath": folder, "readOnly": True}
    pod, container = _dashboard(rendered["defaults"])
    assert not any(a.startswith("--alertmanager") for a in container["args"])
    assert "alertmanager-tls" not in {v["name"] for v in pod["volumes"]}


def test_gpulens_dashboard_knows_the_flags_the_chart_passes(capsys):
    from gpulens.dashboard.launch import dashboard_main

    with pytest.raises(SystemExit) as exit_:
        dashboard_main(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    for flag in (
        "--auth-file",
        "--basic-auth-file",
        "--bearer-token-file",
        "--ca-file",
        "--cert-file",
        "--key-file",
        "--alertmanager",
        "--alertmanager-ca-file",
        "--alertmanager-cert-file",
        "--alertmanager-key-file",
        "--reclaim",
        "--reclaim-basic-auth-file",
        "--address",
        "--port",
        "--refresh",
    ):
        assert flag in usage


# -- least privilege, in every case ----------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(ALL_CASES))
def test_no_pod_gets_more_than_it_needs(rendered, case):
    docs = rendered[case]
    kinds = _kinds(docs)
    assert not {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & kinds.keys()
    for name, pod in _pods(docs):
        agent = name.endswith("-agent")
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["enableServiceLinks"] is False, name
        assert "serviceAccountName" not in pod
        assert not pod.get("hostNetwork") and not pod.get("hostIPC"), name
        assert pod.get("hostPID", False) is agent, f"{name}: only the agent sees host PIDs"
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["privileged"] is False, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            for resources in container["resources"].values():
                assert not any(k.startswith("nvidia.com/") for k in resources), f"{name} takes a GPU"
        if not agent:
            assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        host_paths = {v["hostPath"]["path"]: v["name"] for v in pod["volumes"] if "hostPath" in v}
        assert host_paths.keys() <= HOST_PATHS.keys(), f"{name} mounts {host_paths}"
        assert not host_paths or agent
        mounts = {m["name"]: m for c in pod["containers"] for m in c["volumeMounts"]}
        for path, volume in host_paths.items():
            assert bool(mounts[volume].get("readOnly")) is HOST_PATHS[path], f"{name}: {path}"
        # Secrets hold credentials: no other user in the container reads them (a Secret is 0644 by default),
        # and a non-root pod reads them through its fsGroup.
        for volume in pod["volumes"]:
            projected = volume.get("projected", {})
            if "secret" in volume or any("secret" in source for source in projected.get("sources", [])):
                mode = (volume.get("secret") or projected).get("defaultMode", 0o644)
                assert not mode & 0o007, f"{name}: Secret {volume['name']} is mode {mode:o}"
                assert mounts[volume["name"]]["readOnly"] is True, f"{name}: {volume['name']}"
                if agent:
                    assert mode & 0o400, f"{name}: root cannot read Secret {volume['name']}"
                else:
                    assert mode & 0o040 and pod["securityContext"].get("fsGroup"), f"{name}: {volume['name']}"


def test_the_agent_gets_the_cuda_driver_only_for_probes(rendered):
    def capabilities(docs: list[dict]) -> str:
        _, container = _agent(docs)
        return next(e["value"] for e in container["env"] if e["name"] == "NVIDIA_DRIVER_CAPABILITIES")

    assert capabilities(rendered["defaults"]) == "utility"  # NVML only
    assert capabilities(rendered["agent-only"]) == "compute,utility"  # probes on: kernels need CUDA


def test_every_privilege_is_explained_in_values_and_security_docs():
    values = (CHART / "values.yaml").read_text()
    security = (ROOT / "docs" / "security.md").read_text()
    for key in (
        "hostPID",
        "runAsUser: 0",
        "readOnlyRootFilesystem",
        "capabilities",
        "seccompProfile",
        "podResources",
        "hostCgroups",
        "jobsSocket",
        "ledger",
        "webConfig",
        "bearerTokenSecret",
        "auth:",
        "migMonitoring",
    ):
        line = next(i for i, text in enumerate(values.splitlines()) if text.strip().startswith(key))
        assert values.splitlines()[line - 1].strip().startswith("#"), f"values.yaml: no comment above {key}"
    for words in (
        "hostPID",
        "runAsUser: 0",
        "readOnlyRootFilesystem",
        "drop: [ALL]",
        "RuntimeDefault",
        "automountServiceAccountToken: false",
        "enableServiceLinks: false",
        "/var/lib/kubelet/pod-resources",
        "/sys/fs/cgroup",
        "/run/gpulens",
        "/var/lib/gpulens",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "runtimeClassName",
        "pod-security.kubernetes.io/enforce",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "SYS_ADMIN",
        "agent.migMonitoring",
    ):
        assert words in security, f"docs/security.md does not explain {words}"
    assert yaml.safe_load(values)["agent"]["webConfig"] == {
        "existingSecret": "",
        "tls": False,
        "requireClientCert": False,
    }
