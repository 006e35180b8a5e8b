"""agent.migMonitoring, rendered by the real helm and checked against the Kubernetes schemas.

In a container NVML refuses MIG device handles, and the parent GPU's memory and processes
(NVML_ERROR_NO_PERMISSION), unless the NVIDIA container toolkit mounted the driver's MIG monitor capability
into it (nvidia-container-toolkit issue #842). The toolkit does so for NVIDIA_MIG_MONITOR_DEVICES=all and
refuses that variable to a container without CAP_SYS_ADMIN (cmd/nvidia-container-runtime-hook/
container_config.go), so the value must bring both, and must leave the rest of the security context alone.
These cases are kept out of test_chart.CASES: test_security checks that every case there adds no capability.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.helm.test_chart import (
    CHART,
    OPERATOR_KINDS,
    _agent,
    _helm,
    _kinds,
    _lint,
    _notes,
    _template,
    _validate,
    _values_file,
)

VARIABLE = "NVIDIA_MIG_MONITOR_DEVICES"

MIG_CASES: dict[str, dict] = {
    "defaults": {},
    "mig": {"agent": {"migMonitoring": True}},
    "mig-off": {"agent": {"migMonitoring": False}},
    # A user who reads other users' /proc/PID/environ (values.yaml) keeps SYS_PTRACE beside SYS_ADMIN.
    "mig-ptrace": {"agent": {"migMonitoring": True, "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}},
    "ptrace": {"agent": {"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}},
    # Already added by the user: not twice.
    "mig-own-sys-admin": {
        "agent": {"migMonitoring": True, "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}
    },
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    return {name: _template(tmp_path_factory.mktemp(name), values) for name, values in MIG_CASES.items()}


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_the_mig_cases_lint_and_validate(rendered, tmp_path):
    for name, values in MIG_CASES.items():
        _lint(tmp_path, name, values)
        _validate(rendered[name], skip=OPERATOR_KINDS)


def test_with_mig_monitoring_the_agent_gets_the_variable_and_sys_admin_and_still_drops_all(rendered):
    _, container = _agent(rendered["mig"])
    assert _env(container)[VARIABLE] == {"name": VARIABLE, "value": "all"}
    context = container["securityContext"]
    # SYS_ADMIN, not CAP_SYS_ADMIN: Kubernetes names capabilities without the prefix, which the runtime adds;
    # on containerd "CAP_SYS_ADMIN" grants nothing (kubernetes issue #119568).
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    # Everything else is the default's, line for line: uid 0, read-only root, no escalation, not privileged.
    _, default = _agent(rendered["defaults"])
    others = {k: v for k, v in context.items() if k != "capabilities"}
    assert others == {k: v for k, v in default["securityContext"].items() if k != "capabilities"}
    assert others["allowPrivilegeEscalation"] is False and others["privileged"] is False
    assert others["readOnlyRootFilesystem"] is True
    # The variable sits beside the two the runtime needs anyway, not instead of them.
    assert _env(container)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


@pytest.mark.parametrize("case", ["defaults", "mig-off"])
def test_without_mig_monitoring_the_agent_has_neither(rendered, case):
    _, container = _agent(rendered[case])
    assert VARIABLE not in _env(container)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_users_own_capabilities_are_kept_beside_sys_admin(rendered):
    _, container = _agent(rendered["mig-ptrace"])
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "SYS_ADMIN"]}
    assert _env(container)[VARIABLE]["value"] == "all"
    _, container = _agent(rendered["ptrace"])
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert VARIABLE not in _env(container)
    _, container = _agent(rendered["mig-own-sys-admin"])
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]


def test_only_the_agent_gets_it(rendered):
    dashboard = _kinds(rendered["mig"])["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert dashboard["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert VARIABLE not in _env(dashboard)


def test_the_schema_refuses_a_value_that_is_not_a_boolean(tmp_path):
    values = {"agent": {"migMonitoring": "all"}}
    args = [_helm(), "template", "gpulens", str(CHART), *_values_file(tmp_path, values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "migMonitoring" in result.stderr


def test_notes_say_in_one_line_how_to_monitor_mig_devices_when_it_is_off(tmp_path):
    lines = [line for line in _notes(tmp_path, {}).splitlines() if "MIG" in line]
    assert len(lines) == 1
    assert "agent.migMonitoring=true" in lines[0]
    assert "MIG" not in _notes(tmp_path / "on", MIG_CASES["mig"])
