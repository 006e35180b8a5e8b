"""The Kubernetes actor with the official client against a double of the API's semantics (tests/reclaim/apiserver.py):
what `running()` reads of each pod, how each kind of owner is stopped (the double's stored object after the call),
the API's refusals as one line, and no call beyond what the chart's ClusterRole grants: the double's RBAC rules
are the chart's own, read from helm/gpulens/templates/reclaim-rbac.yaml."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import replace
from typing import Any

import kubernetes
import pytest
import yaml

from gpulens.fleet.records import FleetGpu, Holder
from gpulens.reclaim import kubernetes as actor_module
from gpulens.reclaim.actor import ActorError, Facts
from gpulens.reclaim.folder import Folder
from gpulens.reclaim.kubernetes import FORBIDDEN, KSERVE_STOP, NOTEBOOK_STOPPED, VERBS, Kubernetes, from_config
from gpulens.reclaim.kubernetes import parse_rfc3339 as rfc3339
from gpulens.reclaim.policy import Policy
from gpulens.reclaim.service import Service
from tests.reclaim.apiserver import SERVICE_ACCOUNT, ApiServer, api_server
from tests.reclaim.test_ladder import START
from tests.reclaim.test_service import Clock, FakeSource, audit, run_until
from tests.rules.known import ROOT
from tests.tools import free_port

RBAC = ROOT / "helm" / "gpulens" / "templates" / "reclaim-rbac.yaml"
NOW = 1_796_461_200.0  # 2026-12-05 09:00:00 UTC


def chart_rules() -> list[dict[str, Any]]:
    """The rules of the chart's reclaim ClusterRoles (reading, the nodes', acting in enforce mode), as its template
    writes them (plain YAML: no directive inside; tests/helm/test_chart.py checks the rendered ones have the same)."""
    rules = []
    for block in RBAC.read_text().split("\nrules:\n")[1:]:
        block = re.split(r"\n(?:---|\{\{)", block, maxsplit=1)[0]
        assert "{{" not in block, "the ClusterRoles' rules must stay plain YAML for this test to read them"
        rules += yaml.safe_load("rules:\n" + block)["rules"]
    return rules


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(v, g, r) for rule in rules for v in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]}


# -- a small cluster ------------------------------------------------------------------------------------


def owner(kind: str, name: str, api_version: str, uid: str = "") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid or f"uid-{name}", "controller": True}


def pod(name: str, namespace: str = "ml", uid: str = "", node: str = "gpu-a", phase: str = "Running", **meta: Any):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {}), **meta},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pytorch/pytorch:2.4.0"}]},
        "status": {"phase": phase},
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def workload(kind: str, name: str, namespace: str = "ml", replicas: int | None = 1, **meta: Any) -> dict[str, Any]:
    api = {"Job": "batch/v1", "Notebook": "kubeflow.org/v1", "InferenceService": "serving.kserve.io/v1beta1"}
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": api.get(kind, "apps/v1"),
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **meta},
        "spec": spec,
        "status": {"replicas": replicas or 0},
    }


def deployment_pod(double: ApiServer, name: str = "notebook-7", replicas: int = 1, **deployment_meta: Any) -> str:
    """A Deployment, its ReplicaSet and a running pod of it; return the pod's UID."""
    double.add(workload("Deployment", name, replicas=replicas, **deployment_meta))
    replica_set = f"{name}-5d8f9c7b6"
    double.add(
        workload("ReplicaSet", replica_set, ownerReferences=[owner("Deployment", name, "apps/v1")], replicas=replicas)
    )
    made = double.add(
        pod(f"{replica_set}-x2k9p", ownerReferences=[owner("ReplicaSet", replica_set, "apps/v1")], labels={"app": name})
    )
    return made["metadata"]["uid"]


@pytest.fixture
def double():
    """The double with the chart's RBAC rules, and two GPU nodes in pools."""
    with api_server(rules=chart_rules()) as made:
        made.add(node("gpu-a", **{"cloud.google.com/gke-nodepool": "a100-pool"}))
        made.add(node("gpu-b", **{"karpenter.sh/nodepool": "h100"}))
        yield made


def actor(double: ApiServer, **kw: Any) -> Kubernetes:
    configuration = kubernetes.client.Configuration()
    configuration.host = double.url
    kw.setdefault("clock", lambda: NOW)
    return Kubernetes(kubernetes.client.ApiClient(configuration), **kw)


def stop(double: ApiServer, uid: str, **kw: Any) -> str:
    made = actor(double, **kw)
    made.running()
    return made.act(uid, "cancel")


@pytest.fixture(autouse=True)
def within_the_chart(request):
    """Whatever a test made the actor call, the chart's ClusterRole grants it."""
    yield
    made = request.node.funcargs.get("double")
    if isinstance(made, ApiServer) and made.rules is not None:
        assert made.verbs() <= granted(chart_rules()), made.verbs() - granted(chart_rules())


# -- running() ------------------------------------------------------------------------------------------


def test_running_lists_running_pods_by_uid_with_their_facts(double):
    keep = {"gpulens.io/keep-until": "2026-12-05T18:00:00Z"}
    double.add(
        pod(
            "train-0",
            uid="3f1c2d4e-0000-4000-8000-000000000001",
            labels={"gpulens.io/owner": "alice", "team": "vision"},
            annotations=keep,
        )
    )
    told = {
        "gpulens.io/owner": "bob",
        "gpulens.io/owner-email": " bob@lab.example.org ",
        "gpulens.io/notify-end": "True",
    }
    double.add(pod("serve-1", namespace="inference", uid="uid-serve", node="gpu-b", annotations=told))
    double.add(pod("waiting", uid="uid-pending", phase="Pending"))
    double.add(pod("done", uid="uid-done", phase="Succeeded"))
    double.add(pod("leaving", uid="uid-leaving", deletionTimestamp="2026-12-05T09:00:00Z"))
    double.add(pod("elsewhere", uid="uid-elsewhere", node="cpu-1"))
    jobs = actor(double).running()
    assert set(jobs) == {"3f1c2d4e-0000-4000-8000-000000000001", "uid-serve", "uid-elsewhere"}
    assert jobs["3f1c2d4e-0000-4000-8000-000000000001"] == Facts(
        partition="a100-pool",
        user="alice",
        namespace="ml",
        labels={"gpulens.io/owner": "alice", "team": "vision"},
        keep_until=rfc3339("2026-12-05T18:00:00Z"),
    )
    assert jobs["uid-serve"].partition == "h100" and jobs["uid-serve"].user == "bob"  # an annotation, no label
    assert jobs["uid-serve"].named == "bob@lab.example.org" and jobs["uid-serve"].notify_end
    assert jobs["uid-elsewhere"].named == "" and not jobs["uid-elsewhere"].notify_end
    assert jobs["uid-elsewhere"].partition == "" and jobs["uid-elsewhere"].keep_until is None
    lists = [r for r in double.requests if r.resource == "pods"]
    assert [(r.verb, r.path, r.query["fieldSelector"]) for r in lists] == [
        ("list", "/api/v1/pods", "status.phase=Running")
    ]


def test_running_pages_through_a_long_list(double, monkeypatch):
    monkeypatch.setattr(actor_module, "PAGE", 4)
    for index in range(10):
        double.add(pod(f"worker-{index}", uid=f"uid-{index}"))
    assert len(actor(double).running()) == 10
    pages = [r for r in double.requests if r.resource == "pods"]
    assert [r.query.get("limit") for r in pages] == ["4", "4", "4"] and "continue" in pages[-1].query


def test_only_the_namespaces_given_are_read(double):
    double.add(pod("a", uid="uid-a", namespace="team-a"))
    double.add(pod("b", uid="uid-b", namespace="team-b"))
    double.add(pod("c", uid="uid-c", namespace="team-c"))
    assert set(actor(double, namespaces=["team-a", "team-c"]).running()) == {"uid-a", "uid-c"}
    assert {r.path for r in double.requests if r.resource == "pods"} == {
        "/api/v1/namespaces/team-a/pods",
        "/api/v1/namespaces/team-c/pods",
    }


def test_the_owner_keys_are_configurable_and_the_first_found_wins(double):
    double.add(pod("p", uid="uid-p", labels={"owner": "carol"}, annotations={"example.org/creator": "dave"}))
    assert actor(double, owner_keys=["example.org/creator", "owner"]).running()["uid-p"].user == "dave"
    assert actor(double, owner_keys=["owner"]).running()["uid-p"].user == "carol"
    assert actor(double).running()["uid-p"].user == ""


def test_node_pools_are_listed_once_and_again_for_a_new_node(double):
    clock = [NOW]
    made = actor(double, clock=lambda: clock[0])
    double.add(pod("p", uid="uid-p"))
    for _ in range(3):
        made.running()
    double.add(node("gpu-c", **{"eks.amazonaws.com/nodegroup": "p5"}))
    double.add(pod("q", uid="uid-q", node="gpu-c"))
    assert made.running()["uid-q"].partition == "p5"
    made.running()
    assert sum(r.resource == "nodes" for r in double.requests) == 2
    clock[0] += actor_module.NODES_FOR
    made.running()
    assert sum(r.resource == "nodes" for r in double.requests) == 3


def test_a_pod_on_a_node_the_api_does_not_list_does_not_list_the_nodes_every_cycle(double):
    double.add(pod("stranded", uid="uid-s", node="gone"))
    made = actor(double)
    for _ in range(3):
        assert made.running()["uid-s"].partition == ""
    assert sum(r.resource == "nodes" for r in double.requests) == 1


def test_without_pool_labels_no_node_is_read(double):
    double.add(pod("p", uid="uid-p"))
    assert actor(double, pool_labels=()).running()["uid-p"].partition == ""
    assert not any(r.resource == "nodes" for r in double.requests)


def test_node_pools_read_before_are_kept_when_the_nodes_cannot_be_listed(double):
    clock = [NOW]
    made = actor(double, clock=lambda: clock[0])
    double.add(pod("p", uid="uid-p"))
    made.running()
    double.rules = [r for r in chart_rules() if "nodes" not in r["resources"]]
    clock[0] += actor_module.NODES_FOR
    assert made.running()["uid-p"].partition == "a100-pool"
    with pytest.raises(ActorError, match=r"cannot list the nodes \(for their pools\): nodes is forbidden: User "):
        actor(double).running()  # never read: a policy's partitions cannot be matched, so nothing is sure


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-05T18:00:00Z", 1_796_493_600.0),
        ("2026-12-05t18:00:00z", 1_796_493_600.0),
        ("2026-12-05T19:30:00+01:30", 1_796_493_600.0),
        ("2026-12-05T17:00:00.250-01:00", 1_796_493_600.25),
        ("2026-12-05 18:00:00Z", 1_796_493_600.0),
        ("2026-12-05T18:00:00", None),  # no offset: whose 18:00?
        ("2026-12-05", None),
        ("tomorrow", None),
        ("2026-02-30T18:00:00Z", None),
        ("", None),
    ],
)
def test_keep_until_is_read_as_rfc_3339(text, expected):
    assert rfc3339(text) == expected


def test_an_unreadable_keep_until_is_ignored_with_one_warning(double, caplog):
    double.add(pod("p", uid="uid-p", annotations={"gpulens.io/keep-until": "friday"}))
    made = actor(double)
    with caplog.at_level(logging.WARNING, logger="gpulens.reclaim.kubernetes"):
        for _ in range(3):
            assert made.running()["uid-p"].keep_until is None
    assert [r.getMessage() for r in caplog.records] == [
        "pod ml/p: its annotation gpulens.io/keep-until='friday' is not an RFC 3339 time "
        "(e.g. 2026-12-05T18:00:00Z); ignored"
    ]


# -- act(): each owner stopped its own way --------------------------------------------------------------


def test_a_deployments_pod_scales_the_deployment_to_zero_through_its_scale_subresource(double):
    uid = deployment_pod(double, replicas=2)
    assert stop(double, uid) == "scaled Deployment ml/notebook-7 to 0 replicas (was 2)"
    assert double.get("Deployment", "ml", "notebook-7")["spec"]["replicas"] == 0
    (patch,) = double.writes()
    assert (patch.verb, patch.resource, patch.body) == ("patch", "deployments/scale", {"spec": {"replicas": 0}})
    assert patch.content_type == "application/strategic-merge-patch+json"  # the client's, for a built-in kind


def test_a_statefulsets_pod_scales_it_to_zero(double):
    double.add(workload("StatefulSet", "vllm", replicas=1))
    uid = double.add(pod("vllm-0", ownerReferences=[owner("StatefulSet", "vllm", "apps/v1")]))["metadata"]["uid"]
    assert stop(double, uid) == "scaled StatefulSet ml/vllm to 0 replicas (was 1)"
    assert double.get("StatefulSet", "ml", "vllm")["spec"]["replicas"] == 0
    assert [w.resource for w in double.writes()] == ["statefulsets/scale"]


def test_a_kubeflow_notebook_is_stopped_the_way_its_culler_does(double):
    double.add(workload("Notebook", "alice-nb", replicas=None))
    double.add(workload("StatefulSet", "alice-nb", ownerReferences=[owner("Notebook", "alice-nb", "kubeflow.org/v1")]))
    uid = double.add(pod("alice-nb-0", ownerReferences=[owner("StatefulSet", "alice-nb", "apps/v1")]))["metadata"][
        "uid"
    ]
    said = stop(double, uid)
    assert said == (
        "stopped Kubeflow Notebook ml/alice-nb (annotation kubeflow-resource-stopped=2026-12-05T09:00:00Z; "
        "its StatefulSet goes to 0)"
    )
    notebook = double.get("Notebook", "ml", "alice-nb")
    assert notebook["metadata"]["annotations"] == {NOTEBOOK_STOPPED: "2026-12-05T09:00:00Z"}
    assert double.get("StatefulSet", "ml", "alice-nb")["spec"]["replicas"] == 1  # the notebook controller's to do
    (patch,) = double.writes()
    assert patch.resource == "notebooks" and patch.content_type == "application/merge-patch+json"


def test_a_kserve_pod_stops_its_inference_service(double):
    """Serverless mode: the pod's Deployment belongs to a Knative Revision; the label names the service."""
    double.add(workload("InferenceService", "llama", replicas=None))
    uid = deployment_pod(
        double,
        "llama-predictor-00001-deployment",
        ownerReferences=[owner("Revision", "llama-predictor-00001", "serving.knative.dev/v1")],
    )
    double.get("Pod", "ml", "llama-predictor-00001-deployment-5d8f9c7b6-x2k9p")["metadata"]["labels"][
        "serving.kserve.io/inferenceservice"
    ] = "llama"
    said = stop(double, uid)
    assert said == (
        "stopped KServe InferenceService ml/llama (annotation serving.kserve.io/stop=true; "
        "KServe removes its predictor's pods)"
    )
    assert double.get("InferenceService", "ml", "llama")["metadata"]["annotations"] == {KSERVE_STOP: "true"}
    assert [w.resource for w in double.writes()] == ["inferenceservices"]


def test_a_raw_deployment_owned_by_an_inference_service_stops_the_service(double):
    double.add(workload("InferenceService", "bert", replicas=None))
    uid = deployment_pod(
        double,
        "bert-predictor",
        ownerReferences=[owner("InferenceService", "bert", "serving.kserve.io/v1beta1")],
    )
    assert stop(double, uid).startswith("stopped KServe InferenceService ml/bert")
    assert double.get("Deployment", "ml", "bert-predictor")["spec"]["replicas"] == 1


@pytest.mark.parametrize("cron", [False, True])
def test_a_jobs_pod_suspends_the_job(double, cron):
    meta = {"ownerReferences": [owner("CronJob", "nightly", "batch/v1")]} if cron else {}
    double.add(workload("Job", "finetune", replicas=None, **meta))
    made = double.add(pod("finetune-abcde", ownerReferences=[owner("Job", "finetune", "batch/v1")]))
    said = stop(double, made["metadata"]["uid"])
    assert said == "suspended Job ml/finetune (its pods are removed; spec.suspend=false resumes it)"
    assert double.get("Job", "ml", "finetune")["spec"]["suspend"] is True
    assert double.get("Pod", "ml", "finetune-abcde") is not None  # suspended, not deleted: the Job controller's


def test_a_bare_pod_is_deleted_on_the_condition_that_it_is_the_same_pod(double):
    uid = double.add(pod("debug-shell"))["metadata"]["uid"]
    assert stop(double, uid) == "deleted pod ml/debug-shell (it has no owner to stop)"
    assert double.get("Pod", "ml", "debug-shell") is None
    (delete,) = double.writes()
    assert delete.verb == "delete" and delete.body["preconditions"] == {"uid": uid}


def test_what_is_stopped_already_is_not_written_again(double):
    uid = deployment_pod(double, replicas=0)
    assert stop(double, uid) == "Deployment ml/notebook-7 was already at 0 replicas"
    double.add(workload("Job", "done", replicas=None))
    double.get("Job", "ml", "done")["spec"]["suspend"] = True
    job_pod = double.add(pod("done-x", ownerReferences=[owner("Job", "done", "batch/v1")]))
    assert stop(double, job_pod["metadata"]["uid"]) == "Job ml/done was already suspended"
    assert double.writes() == []


@pytest.mark.parametrize(
    ("owners", "said"),
    [
        (
            [owner("DaemonSet", "dcgm", "apps/v1")],
            "pod ml/p is managed by DaemonSet ml/dcgm (apps/v1), which gpulens reclaim does not stop",
        ),
        (
            [owner("PyTorchJob", "train", "kubeflow.org/v1")],
            "pod ml/p is managed by PyTorchJob ml/train (kubeflow.org/v1), which gpulens reclaim does not stop",
        ),
    ],
)
def test_a_pod_of_another_controller_is_not_touched(double, owners, said):
    uid = double.add(pod("p", ownerReferences=owners))["metadata"]["uid"]
    with pytest.raises(ActorError) as refused:
        stop(double, uid)
    assert str(refused.value) == (
        f"{said}: it would start the pods again; exempt it (a label, its namespace) or stop it by hand"
    )
    assert double.writes() == []


def test_a_deployment_another_controller_manages_is_not_scaled(double):
    uid = deployment_pod(double, "web", ownerReferences=[owner("Revision", "web-00001", "serving.knative.dev/v1")])
    with pytest.raises(ActorError, match=r"\(of Deployment ml/web\) is managed by Revision ml/web-00001"):
        stop(double, uid)
    assert double.writes() == [] and double.get("Deployment", "ml", "web")["spec"]["replicas"] == 1


def test_signals_are_refused_in_one_line():
    made = Kubernetes.__new__(Kubernetes)
    with pytest.raises(ActorError) as refused:
        made.signal("uid", "USR1")
    assert str(refused.value) == (
        "Kubernetes pods cannot be signalled (no API call sends USR1 to a container's processes); "
        "leave `signal` out of the policies that match Kubernetes jobs"
    )
    assert Kubernetes.signals is False


# -- refusals and failures: one line each ---------------------------------------------------------------


def test_an_rbac_refusal_names_the_object_and_the_missing_right(double):
    uid = deployment_pod(double)
    double.rules = [
        {**rule, "resources": [r for r in rule["resources"] if r != "deployments/scale"]} for rule in chart_rules()
    ]
    with pytest.raises(ActorError) as refused:
        stop(double, uid)
    assert str(refused.value) == (
        'cannot scale Deployment ml/notebook-7 to 0: deployments.apps "notebook-7" is forbidden: User '
        f'"{SERVICE_ACCOUNT}" cannot patch resource "deployments/scale" in API group "apps" in the namespace "ml" '
        f"({FORBIDDEN})"
    )
    assert double.get("Deployment", "ml", "notebook-7")["spec"]["replicas"] == 1


def test_a_listing_refused_at_the_cluster_scope_is_one_line(double):
    double.rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    with pytest.raises(ActorError) as refused:
        actor(double).running()
    assert str(refused.value) == (
        f'cannot list the running pods: pods is forbidden: User "{SERVICE_ACCOUNT}" cannot list resource "pods" '
        f'in API group "" at the cluster scope ({FORBIDDEN})'
    )


def test_a_pod_gone_since_the_listing_is_an_error_naming_it(double):
    uid = deployment_pod(double)
    made = actor(double)
    made.running()
    double.remove("Pod", "ml", "notebook-7-5d8f9c7b6-x2k9p")
    with pytest.raises(
        ActorError,
        match=r'^cannot read pod ml/notebook-7-5d8f9c7b6-x2k9p: pods "notebook-7-5d8f9c7b6-x2k9p" not found$',
    ):
        made.act(uid, "cancel")
    with pytest.raises(ActorError, match=r"^pod uid-never is not running any more"):
        made.act("uid-never", "cancel")
    assert double.writes() == []


def test_a_pod_replaced_by_one_of_the_same_name_is_left_alone(double):
    uid = double.add(pod("debug-shell"))["metadata"]["uid"]
    made = actor(double)
    made.running()
    double.add(pod("debug-shell", uid="uid-new"))
    with pytest.raises(ActorError, match=f"^pod ml/debug-shell is another pod now \\(UID uid-new, not {uid}\\)"):
        made.act(uid, "cancel")
    assert double.get("Pod", "ml", "debug-shell") is not None and double.writes() == []


def test_an_owner_gone_is_an_error_naming_it(double):
    uid = deployment_pod(double)
    double.remove("Deployment", "ml", "notebook-7")
    with pytest.raises(
        ActorError, match=r'^cannot read Deployment ml/notebook-7: deployments.apps "notebook-7" not found$'
    ):
        stop(double, uid)


def test_a_conflict_is_one_line(double):
    """The double's own precondition check, as the client's delete meets it."""
    double.add(pod("p", uid="uid-p"))
    made = actor(double)
    body = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid="uid-other"))
    with pytest.raises(ActorError) as refused:
        made._call("delete pod ml/p", made._core.delete_namespaced_pod, "p", "ml", body=body)
    assert str(refused.value) == (
        'cannot delete pod ml/p: Operation cannot be fulfilled on pods "p": Precondition failed: UID in '
        "precondition: uid-other, UID in object meta: uid-p (it changed meanwhile; tried again next cycle)"
    )
    assert double.get("Pod", "ml", "p") is not None


def test_an_api_server_that_refuses_connections_is_one_line():
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    made = Kubernetes(kubernetes.client.ApiClient(configuration))
    with pytest.raises(ActorError) as refused:
        made.running()
    assert str(refused.value) == (
        f"cannot list the running pods: the API server at {configuration.host} does not answer (Connection refused)"
    )


def test_an_api_server_that_does_not_answer_in_time_is_one_line(double):
    double.add(pod("p", uid="uid-p"))
    double.delay = 0.5
    with pytest.raises(ActorError) as refused:
        actor(double, timeout=0.1).running()
    assert str(refused.value) == f"cannot list the running pods: the API server at {double.url} did not answer in 0.1 s"


# -- configuration --------------------------------------------------------------------------------------


def test_from_config_reads_a_kubeconfig(double, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": double.url}}],
                "users": [{"name": "ops", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "ops"}}],
                "current-context": "lab",
            }
        )
    )
    double.add(pod("p", uid="uid-p"))
    assert set(from_config(str(config)).running()) == {"uid-p"}
    with pytest.raises(ActorError, match=f"^cannot configure the Kubernetes client from kubeconfig {tmp_path}/none: "):
        from_config(str(tmp_path / "none"))


def test_in_a_pod_without_a_service_account_token_from_config_says_so(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ActorError) as refused:
        from_config()
    assert str(refused.value).startswith("cannot configure the Kubernetes client from the pod's service account: ")
    assert "\n" not in str(refused.value)


def test_importing_the_reclaim_service_needs_no_kubernetes_client():
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "import gpulens.reclaim.cli, gpulens.reclaim.service, gpulens.reclaim.kubernetes as k\n"
        "try:\n    k.from_config()\nexcept k.ActorError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == actor_module.MISSING


def test_the_actor_uses_exactly_the_verbs_the_chart_grants():
    assert granted(chart_rules()) == VERBS


# -- the service --------------------------------------------------------------------------------------


def kubernetes_gpu(index: int, uid: str, pod_name: str) -> FleetGpu:
    return FleetGpu(
        node="gpu-a", gpu=str(index), uuid=f"GPU-{index}", model="NVIDIA H100 80GB HBM3", state="idle",
        since=START, holders=(Holder("kubernetes", uid, namespace="ml", pod=pod_name, container="main"),),
    )  # fmt: skip


def service_over(double: ApiServer, tmp_path, mode: str) -> tuple[Service, Clock, Folder]:
    clock = Clock()
    uid = deployment_pod(double, replicas=1)
    gpus = [kubernetes_gpu(0, uid, "notebook-7-5d8f9c7b6-x2k9p"), kubernetes_gpu(1, uid, "notebook-7-5d8f9c7b6-x2k9p")]
    folder = Folder(tmp_path / "state").create()
    made = Service(FakeSource(gpus), replace(Policy(), mode=mode), folder, actors=[actor(double)], clock=clock)
    return made, clock, folder


def test_the_service_in_enforce_mode_scales_an_idle_notebooks_deployment_to_zero(double, tmp_path):
    made, clock, folder = service_over(double, tmp_path, "enforce")
    run_until(made, clock, 125)
    uid = double.get("Pod", "ml", "notebook-7-5d8f9c7b6-x2k9p")["metadata"]["uid"]
    job = f"kubernetes/{uid}"
    assert audit(folder) == [(60, "warned", job), (105, "warned", job), (120, "acted", job)]
    acted = list(folder.audit_records())[-1]
    assert acted["detail"] == "scaled Deployment ml/notebook-7 to 0 replicas (was 1)"
    assert acted["partition"] == "a100-pool" and acted["gpus"] == ["gpu-a/0", "gpu-a/1"]
    assert double.get("Deployment", "ml", "notebook-7")["spec"]["replicas"] == 0
    assert [w.resource for w in double.writes()] == ["deployments/scale"]


def test_the_service_in_dry_run_writes_nothing_to_the_cluster(double, tmp_path):
    made, clock, folder = service_over(double, tmp_path, "dry-run")
    run_until(made, clock, 130)
    assert [event for _, event, _ in audit(folder)] == ["would_warn", "would_warn", "would_act"]
    assert double.writes() == [] and double.get("Deployment", "ml", "notebook-7")["spec"]["replicas"] == 1
