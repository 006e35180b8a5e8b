"""Acting on Kubernetes workloads through the API server, with the official client (`kubernetes` on PyPI, the
`reclaim-kubernetes` extra), as an operator would with kubectl.

The agents name a Kubernetes job by its pod's UID (job_kind "kubernetes"); the service runs in the cluster
with a service account that the chart's reclaim ClusterRole binds (helm/gpulens/templates/reclaim-rbac.yaml),
or anywhere with a kubeconfig (`from_config`).

- `running()`: the pods whose phase is Running (in every namespace, or in those given), by UID, with what a
  policy reads of them: the namespace, the node pool of their node as `partition` (GKE's, EKS', AKS' or
  Karpenter's pool label: POOL_LABELS), the owner as `user` (the first of `owner_keys`, a label or else an
  annotation of the pod), the pod's labels, and a keep its owner wrote on the pod (the annotation
  gpulens.io/keep-until, an RFC 3339 time; one that does not read is ignored, with a warning). For the
  messages to the owner (gpulens.notify): an address or chat handle in the annotation gpulens.io/owner-email,
  and gpulens.io/notify-end: "true" (a label or annotation) for a message as the pod ends. A pod being
  deleted is not listed: it is going away already.
- `act()`: the policy's action (`cancel`, `requeue`, `requeue_hold`: Slurm's words) means one thing for every
  Kubernetes workload: **stop it**, the way its own controller lets a person stop it and start it again, so
  that its GPUs are given back and nothing starts it again by itself:

  - a pod of a Deployment (through its ReplicaSet): the Deployment scaled to 0 (the `scale` subresource);
  - a pod of a StatefulSet: the StatefulSet scaled to 0 the same way;
  - a pod of a Kubeflow Notebook (kubeflow.org/v1, the owner of its StatefulSet): the Notebook's
    `kubeflow-resource-stopped` annotation set to the time, as Kubeflow's culler stops one;
  - a pod of a KServe InferenceService (serving.kserve.io/v1beta1; its pods carry the label
    serving.kserve.io/inferenceservice): its `serving.kserve.io/stop: "true"` annotation;
  - a pod of a Job (batch/v1), alone or of a CronJob: the Job suspended (`spec.suspend: true`), not deleted:
    its pods go, the Job stays, and `spec.suspend: false` resumes it;
  - a bare pod (no owner): the pod deleted, on the condition that its UID is still the one the agents saw.

  A pod run by anything else (a DaemonSet, a ReplicaSet without a Deployment, a Deployment or StatefulSet that
  another controller manages, a training operator's job, ...) is not acted on: its controller would undo a
  scale to 0 or start the pod again. The action fails with a line naming the owner.
- `signal()`: Kubernetes has no call that signals a container's processes (short of exec), so it fails.

Every call the API server refuses or does not answer (403 from RBAC, 404 for an object gone, 409, a
connection refused, a timeout) is an ActorError with one line naming the object and the API's own words.
The calls made are exactly VERBS: the chart's ClusterRole grants those and no more (its tests check both).

The client is imported when a Kubernetes actor is made, never by `import gpulens.reclaim`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from gpulens.reclaim.actor import ActorError, Facts

log = logging.getLogger(__name__)

# The node labels that name a node's pool: GKE, EKS managed node groups, AKS, Karpenter.
POOL_LABELS = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool",
)
OWNER_KEYS = ("gpulens.io/owner",)  # a pod's label (or else annotation) naming the person who owns it
KEEP_UNTIL = "gpulens.io/keep-until"  # a pod's annotation: no warning, no action before this RFC 3339 time
OWNER_EMAIL = "gpulens.io/owner-email"  # a pod's annotation: its owner's address or chat handle
NOTIFY_END = "gpulens.io/notify-end"  # a pod's label or annotation: "true" tells its owner as it ends
# Kubeflow's notebook controller scales a Notebook's StatefulSet to 0 while this annotation is on the Notebook;
# its culler sets it to the time it stopped the Notebook, RFC 3339 (components/notebook-controller/pkg/culler:
# STOP_ANNOTATION, createTimestamp). Removing it starts the Notebook again.
NOTEBOOK_STOPPED = "kubeflow-resource-stopped"
# KServe's force-stop annotation (pkg/constants: StopAnnotationKey; utils.GetForceStopRuntime reads "true" in
# any case): the controller removes the InferenceService's serving workloads and keeps the InferenceService, as
# "Stop and resume a model" documents it; since KServe 0.15.1 in Serverless mode (kserve#4337), 0.16 in
# RawDeployment mode (kserve#4455). `minReplicas: 0` is not enough: Knative scales a service with traffic up
# again, and RawDeployment (HPA) mode cannot scale to zero at all. Removing it starts the model again.
KSERVE_STOP = "serving.kserve.io/stop"
KSERVE_LABEL = "serving.kserve.io/inferenceservice"  # on every pod of an InferenceService: its name

# Every call `running()` and `act()` make, as RBAC names them (verb, API group, resource): what the chart's
# ClusterRole must grant, and all it grants.
VERBS = frozenset(
    {
        ("list", "", "pods"),
        ("get", "", "pods"),
        ("delete", "", "pods"),
        ("list", "", "nodes"),
        ("get", "apps", "replicasets"),
        ("get", "apps", "deployments"),
        ("patch", "apps", "deployments/scale"),
        ("get", "apps", "statefulsets"),
        ("patch", "apps", "statefulsets/scale"),
        ("get", "batch", "jobs"),
        ("patch", "batch", "jobs"),
        ("get", "kubeflow.org", "notebooks"),
        ("patch", "kubeflow.org", "notebooks"),
        ("get", "serving.kserve.io", "inferenceservices"),
        ("patch", "serving.kserve.io", "inferenceservices"),
    }
)

TIMEOUT = 30.0  # seconds for one call: the API server answers in well under one; a hung one must not hang us
PAGE = 500  # objects per list call, as kubectl pages them
NODES_FOR = 600.0  # seconds the node pools are kept before they are listed again
MISSING = (
    "the Kubernetes client is not installed: install gpulens with its reclaim-kubernetes extra "
    "(pip install 'gpulens[reclaim-kubernetes]')"
)
FORBIDDEN = (
    "the service account lacks this right; the chart's reclaim ClusterRole grants every one gpulens reclaim uses"
)
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:([Zz])|([+-])(\d\d):(\d\d))",
    re.ASCII,
)


def client_module() -> Any:
    """The official client's `kubernetes.client`; ActorError saying how to install it where it is missing."""
    try:
        return importlib.import_module("kubernetes.client")
    except ImportError:
        raise ActorError(MISSING) from None


def from_config(kubeconfig: str | None = None, **options: Any) -> Kubernetes:
    """A Kubernetes actor with the service account of the pod it runs in, else a kubeconfig: the file
    `kubeconfig` names when given, else $KUBECONFIG or ~/.kube/config, as kubectl reads them. `options` go to
    Kubernetes(); ActorError in one line when no configuration reads."""
    k8s = client_module()
    config = importlib.import_module("kubernetes.config")
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as error:
        where = (
            f"kubeconfig {kubeconfig}"
            if kubeconfig
            else "the pod's service account"
            if os.environ.get("KUBERNETES_SERVICE_HOST")
            else "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
        )
        raise ActorError(f"cannot configure the Kubernetes client from {where}: {_one_line(error)}") from None
    return Kubernetes(k8s.ApiClient(configuration), **options)


class Kubernetes:
    kind = "kubernetes"
    signals = False  # no signal reaches a pod's processes: a policy's `signal` cannot be sent

    def __init__(
        self,
        api_client: Any,
        namespaces: Sequence[str] = (),
        owner_keys: Sequence[str] = OWNER_KEYS,
        pool_labels: Sequence[str] = POOL_LABELS,
        timeout: float = TIMEOUT,
        clock: Callable[[], float] = time.time,
    ):
        """`api_client`: a kubernetes.client.ApiClient; `namespaces`: only these (every namespace when empty);
        `owner_keys`: the pod labels or annotations naming its owner, first found wins; `pool_labels`: the node
        labels naming its pool (none: no node is read and `partition` stays empty)."""
        k8s = client_module()
        self._api_client = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._apps = k8s.AppsV1Api(api_client)
        self._batch = k8s.BatchV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._refused = k8s.ApiException
        # What the transport raises where no answer comes: urllib3's errors (a connection refused, a timeout).
        self._unanswered = (importlib.import_module("urllib3.exceptions").HTTPError, OSError)
        self._k8s = k8s
        self.namespaces = tuple(namespaces)
        self.owner_keys = tuple(owner_keys)
        self.pool_labels = tuple(pool_labels)
        self.timeout = timeout
        self.clock = clock
        self._pods: dict[str, tuple[str, str]] = {}  # UID -> (namespace, name), from the last listing
        self._pools: dict[str, str] = {}  # node -> pool
        self._pools_at: float | None = None
        self._warned: set[tuple[str, str]] = set()  # (pod UID, keep-until value) already warned about

    # -- running ------------------------------------------------------------------------------------

    def running(self) -> dict[str, Facts]:
        """Every running pod by UID, with what a policy reads of it."""
        pods = []
        for namespace in self.namespaces or (None,):
            pods.extend(self._running_pods(namespace))
        nodes = {str(_get(pod, "spec", "nodeName") or "") for pod in pods} - {""}
        pools = self._node_pools(nodes)
        jobs: dict[str, Facts] = {}
        where: dict[str, tuple[str, str]] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            uid, namespace, name = str(meta.get("uid") or ""), str(meta.get("namespace") or ""), meta.get("name")
            if not uid or meta.get("deletionTimestamp"):
                continue  # going away already
            labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
            user = next((found[k] for k in self.owner_keys for found in (labels, annotations) if k in found), "")
            jobs[uid] = Facts(
                partition=pools.get(str(_get(pod, "spec", "nodeName") or ""), ""),
                user=user,
                namespace=namespace,
                labels=labels,
                keep_until=self._keep_until(uid, f"{namespace}/{name}", annotations.get(KEEP_UNTIL)),
                named=annotations.get(OWNER_EMAIL, "").strip(),  # a label cannot hold "@"
                notify_end=annotations.get(NOTIFY_END, labels.get(NOTIFY_END, "")).strip().lower() == "true",
            )
            where[uid] = (namespace, str(name))
        self._pods = where
        return jobs

    def _running_pods(self, namespace: str | None) -> list[dict[str, Any]]:
        running = {"field_selector": "status.phase=Running"}
        if namespace is None:
            return self._list("list the running pods", self._core.list_pod_for_all_namespaces, **running)
        doing = f"list the running pods in namespace {namespace}"
        return self._list(doing, self._core.list_namespaced_pod, namespace, **running)

    def _list(self, doing: str, method: Callable[..., Any], *args: Any, **query: Any) -> list[dict[str, Any]]:
        """Every item of a list call, page by page."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page = self._call(doing, method, *args, limit=PAGE, **query, **({"_continue": token} if token else {}))
            items.extend(page.get("items") or [])
            token = _get(page, "metadata", "continue")
            if not token:
                return items

    def _node_pools(self, nodes: set[str]) -> dict[str, str]:
        """Each node's pool, listed again when NODES_FOR has passed or a node is new; a failed listing keeps
        the pools read before, and fails `running()` only when none was ever read."""
        if not self.pool_labels:
            return {}
        now = self.clock()
        fresh = self._pools_at is not None and now - self._pools_at < NODES_FOR
        if fresh and nodes <= self._pools.keys():
            return self._pools
        try:
            listed = self._list("list the nodes (for their pools)", self._core.list_node)
        except ActorError as error:
            if self._pools_at is None:
                raise
            log.warning("%s; the pools read before are kept", error)
            return self._pools
        pools = {node: "" for node in nodes}  # a pod's node that is not listed (gone) has no pool: not asked again
        for node in listed:
            labels = _get(node, "metadata", "labels") or {}
            pools[str(_get(node, "metadata", "name"))] = next(
                (str(labels[k]) for k in self.pool_labels if k in labels), ""
            )
        self._pools, self._pools_at = pools, now
        return self._pools

    def _keep_until(self, uid: str, pod: str, value: str | None) -> float | None:
        if value is None:
            return None
        seconds = parse_rfc3339(value)
        if seconds is None and (uid, value) not in self._warned:
            self._warned.add((uid, value))
            log.warning(
                "pod %s: its annotation %s=%r is not an RFC 3339 time (e.g. 2026-12-05T18:00:00Z); ignored",
                pod,
                KEEP_UNTIL,
                value,
            )
        return seconds

    # -- signal and act -----------------------------------------------------------------------------

    def signal(self, job: str, signal: str) -> str:
        raise ActorError(
            f"Kubernetes pods cannot be signalled (no API call sends {signal} to a container's processes); "
            "leave `signal` out of the policies that match Kubernetes jobs"
        )

    def act(self, job: str, action: str) -> str:
        """Stop the workload the pod `job` (its UID) belongs to; `action` means "stop" for every one."""
        namespace, name = self._where(job)
        pod = self._call(f"read pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace)
        meta = pod.get("metadata") or {}
        if meta.get("uid") != job:
            raise ActorError(
                f"pod {namespace}/{name} is another pod now (UID {meta.get('uid')}, not {job}): "
                "the one the verdicts are about is gone"
            )
        if meta.get("deletionTimestamp"):
            return f"pod {namespace}/{name} was already being deleted (since {meta['deletionTimestamp']})"
        labels = meta.get("labels") or {}
        if labels.get(KSERVE_LABEL):
            return self._stop_inference_service(namespace, str(labels[KSERVE_LABEL]))
        owner = _controller(meta)
        if owner is None:
            return self._delete_pod(namespace, name, job)
        kind, group = owner.get("kind"), _group(owner)
        if (kind, group) == ("ReplicaSet", "apps"):
            return self._stop_replica_set(namespace, str(owner["name"]), f"pod {namespace}/{name}")
        if (kind, group) == ("StatefulSet", "apps"):
            return self._stop_stateful_set(namespace, str(owner["name"]), f"pod {namespace}/{name}")
        if (kind, group) == ("Job", "batch"):
            return self._suspend_job(namespace, str(owner["name"]), f"pod {namespace}/{name}")
        raise _not_ours(f"pod {namespace}/{name}", owner, namespace)

    def _where(self, job: str) -> tuple[str, str]:
        """The namespace and name of the pod with UID `job`, from the last listing (listed again if missing)."""
        if job not in self._pods:
            self.running()
        if job not in self._pods:
            raise ActorError(f"pod {job} is not running any more (the API server lists no running pod with that UID)")
        return self._pods[job]

    def _stop_replica_set(self, namespace: str, name: str, whose: str) -> str:
        replica_set = self._call(
            f"read ReplicaSet {namespace}/{name}", self._apps.read_namespaced_replica_set, name, namespace
        )
        owner = _controller(replica_set.get("metadata") or {})
        if owner is None or (owner.get("kind"), _group(owner)) != ("Deployment", "apps"):
            raise _not_ours(f"{whose} (of ReplicaSet {namespace}/{name})", owner, namespace)
        deployment_name = str(owner["name"])
        deployment = self._call(
            f"read Deployment {namespace}/{deployment_name}",
            self._apps.read_namespaced_deployment,
            deployment_name,
            namespace,
        )
        manager = _controller(deployment.get("metadata") or {})
        if manager is not None and (manager.get("kind"), _group(manager)) == ("InferenceService", "serving.kserve.io"):
            return self._stop_inference_service(namespace, str(manager["name"]))
        if manager is not None:
            raise _not_ours(f"{whose} (of Deployment {namespace}/{deployment_name})", manager, namespace)
        return self._scale("Deployment", namespace, deployment, self._apps.patch_namespaced_deployment_scale)

    def _stop_stateful_set(self, namespace: str, name: str, whose: str) -> str:
        stateful_set = self._call(
            f"read StatefulSet {namespace}/{name}", self._apps.read_namespaced_stateful_set, name, namespace
        )
        manager = _controller(stateful_set.get("metadata") or {})
        if manager is not None and (manager.get("kind"), _group(manager)) == ("Notebook", "kubeflow.org"):
            return self._stop_notebook(namespace, str(manager["name"]))
        if manager is not None:
            raise _not_ours(f"{whose} (of StatefulSet {namespace}/{name})", manager, namespace)
        return self._scale("StatefulSet", namespace, stateful_set, self._apps.patch_namespaced_stateful_set_scale)

    def _scale(self, kind: str, namespace: str, workload: dict[str, Any], patch: Callable[..., Any]) -> str:
        name = str(_get(workload, "metadata", "name"))
        replicas = _get(workload, "spec", "replicas")
        was = 1 if replicas is None else replicas  # the API's default
        if was == 0:
            return f"{kind} {namespace}/{name} was already at 0 replicas"
        self._call(f"scale {kind} {namespace}/{name} to 0", patch, name, namespace, {"spec": {"replicas": 0}})
        return f"scaled {kind} {namespace}/{name} to 0 replicas (was {was})"

    def _stop_notebook(self, namespace: str, name: str) -> str:
        what = f"Kubeflow Notebook {namespace}/{name}"
        notebook = self._custom_object(what, "kubeflow.org", "v1", "notebooks", namespace, name)
        stopped = (_get(notebook, "metadata", "annotations") or {}).get(NOTEBOOK_STOPPED)
        if stopped is not None:
            return f"{what} was already stopped (annotation {NOTEBOOK_STOPPED}={stopped})"
        stamp = datetime.fromtimestamp(self.clock(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"metadata": {"annotations": {NOTEBOOK_STOPPED: stamp}}}
        self._patch_custom(f"stop {what}", "kubeflow.org", "v1", "notebooks", namespace, name, body)
        return f"stopped {what} (annotation {NOTEBOOK_STOPPED}={stamp}; its StatefulSet goes to 0)"

    def _stop_inference_service(self, namespace: str, name: str) -> str:
        what = f"KServe InferenceService {namespace}/{name}"
        service = self._custom_object(what, "serving.kserve.io", "v1beta1", "inferenceservices", namespace, name)
        if str((_get(service, "metadata", "annotations") or {}).get(KSERVE_STOP, "")).lower() == "true":
            return f"{what} was already stopped (annotation {KSERVE_STOP}=true)"
        body = {"metadata": {"annotations": {KSERVE_STOP: "true"}}}
        self._patch_custom(f"stop {what}", "serving.kserve.io", "v1beta1", "inferenceservices", namespace, name, body)
        return f"stopped {what} (annotation {KSERVE_STOP}=true; KServe removes its predictor's pods)"

    def _suspend_job(self, namespace: str, name: str, whose: str) -> str:
        job = self._call(f"read Job {namespace}/{name}", self._batch.read_namespaced_job, name, namespace)
        manager = _controller(job.get("metadata") or {})
        if manager is not None and (manager.get("kind"), _group(manager)) != ("CronJob", "batch"):
            raise _not_ours(f"{whose} (of Job {namespace}/{name})", manager, namespace)
        if _get(job, "spec", "suspend"):
            return f"Job {namespace}/{name} was already suspended"
        self._call(
            f"suspend Job {namespace}/{name}",
            self._batch.patch_namespaced_job,
            name,
            namespace,
            {"spec": {"suspend": True}},
        )
        return f"suspended Job {namespace}/{name} (its pods are removed; spec.suspend=false resumes it)"

    def _delete_pod(self, namespace: str, name: str, uid: str) -> str:
        # Only that pod: another one given the same name since (a new pod of the same spec) is left alone.
        body = self._k8s.V1DeleteOptions(preconditions=self._k8s.V1Preconditions(uid=uid))
        self._call(f"delete pod {namespace}/{name}", self._core.delete_namespaced_pod, name, namespace, body=body)
        return f"deleted pod {namespace}/{name} (it has no owner to stop)"

    def _custom_object(self, what: str, group: str, version: str, plural: str, namespace: str, name: str) -> Any:
        read = self._custom.get_namespaced_custom_object
        return self._call(f"read {what}", read, group, version, namespace, plural, name)

    def _patch_custom(
        self, doing: str, group: str, version: str, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> None:
        # A JSON merge patch: the client's content type for a custom object patched with a map.
        patch = self._custom.patch_namespaced_custom_object
        self._call(doing, patch, group, version, namespace, plural, name, body)

    # -- calls --------------------------------------------------------------------------------------

    def _call(self, doing: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Make one API call; return its JSON object as the API server sent it (not the client's models), or
        raise ActorError with one line: what was being done, and the API server's words or why it did not
        answer."""
        try:
            # (connect, read): clients before 36 ignore a lone number that is not an int.
            timeout = (self.timeout, self.timeout)
            response = method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            try:
                data = response.data
            finally:
                response.release_conn()
        except self._refused as error:
            raise ActorError(f"cannot {doing}: {_api_words(error)}") from None
        except self._unanswered as error:
            host = getattr(self._api_client.configuration, "host", "?")
            raise ActorError(f"cannot {doing}: the API server at {host} {_no_answer(error, self.timeout)}") from None
        try:
            found = json.loads(data) if data else {}
        except ValueError:
            raise ActorError(f"cannot {doing}: the API server's answer is not JSON") from None
        if not isinstance(found, dict):
            raise ActorError(f"cannot {doing}: the API server answered {type(found).__name__}, not an object")
        return found


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time ("2026-12-05T18:00:00Z", "...18:00:00.5+01:00"); None
    for anything else, a time without its offset included."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    offset = timedelta(0) if zulu else timedelta(hours=int(off_h), minutes=int(off_m)) * (1 if sign == "+" else -1)
    try:
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), min(int(second), 59), tzinfo=timezone(offset)
        )
    except ValueError:  # 2026-02-30, an hour 25, an offset of a day
        return None
    return moment.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _controller(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner reference that manages the object (controller: true), None for an object nothing manages."""
    return next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)


def _group(reference: Mapping[str, Any]) -> str:
    return str(reference.get("apiVersion", "")).rpartition("/")[0]  # "apps/v1" -> "apps"; "v1" -> ""


def _not_ours(whose: str, owner: Mapping[str, Any] | None, namespace: str) -> ActorError:
    if owner is None:
        return ActorError(f"{whose} has no Deployment over it; gpulens reclaim stops no bare ReplicaSet")
    return ActorError(
        f"{whose} is managed by {owner.get('kind')} {namespace}/{owner.get('name')} ({owner.get('apiVersion')}), "
        "which gpulens reclaim does not stop: it would start the pods again; exempt it (a label, its namespace) "
        "or stop it by hand"
    )


def _api_words(error: Any) -> str:
    """The API server's message for a refused call (its Status object's), with what to do for a 403 or 401."""
    body = getattr(error, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    message = ""
    try:
        status = json.loads(body) if body else None
        if isinstance(status, dict):
            message = str(status.get("message") or "")
    except ValueError:
        message = str(body or "")[:200]
    words = _one_line(message) or f"HTTP {getattr(error, 'status', '?')} {getattr(error, 'reason', '')}".strip()
    code = getattr(error, "status", None)
    if code == 403:
        return f"{words} ({FORBIDDEN})"
    if code == 401:
        return f"{words} (the API server does not accept the credentials: the service account's token or kubeconfig)"
    if code == 409:
        return f"{words} (it changed meanwhile; tried again next cycle)"
    return words


def _no_answer(error: BaseException, timeout: float) -> str:
    """Why the API server did not answer, in a few words: urllib3 wraps the system's error in its own."""
    text = f"{error} {getattr(error, 'reason', '')}"
    if "timed out" in text.lower() or "timeout" in type(error).__name__.lower():
        return f"did not answer in {timeout:g} s"
    system = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return f"does not answer ({system.group(1).strip() if system else type(error).__name__})"


def _one_line(error: object) -> str:
    return " ".join(str(error).split())
