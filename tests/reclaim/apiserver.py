"""A double of the Kubernetes API's semantics for exactly what gpulens.reclaim.kubernetes uses: not the API
server, but its answers, over real HTTP on 127.0.0.1, so that the official client's own requests are served.

What it covers:
- objects of a few resources, each stored by namespace and name with a UID, a resourceVersion bumped on every
  write and a creationTimestamp: pods and nodes (v1), replicasets, deployments and statefulsets (apps/v1),
  jobs (batch/v1), Kubeflow's notebooks (kubeflow.org/v1) and KServe's inferenceservices
  (serving.kserve.io/v1beta1);
- GET of an object, and LIST of a resource in a namespace or across all of them, with the field selectors the
  API server knows for pods (metadata.name, metadata.namespace, spec.nodeName, status.phase; `=`, `==`, `!=`)
  and paging (`limit`, `continue`); list items lack kind and apiVersion, as the API server sends them;
- GET and PATCH of the `scale` subresource of deployments, statefulsets and replicasets, answered with an
  autoscaling/v1 Scale;
- PATCH as a JSON merge patch (RFC 7386) or a strategic merge patch (applied as a merge patch: the patches
  made here hold no list), a patch's metadata.resourceVersion as an optimistic lock (409 when stale); a
  strategic merge patch of a custom resource refused with 415, as the API server refuses it;
- DELETE of an object, honouring DeleteOptions' preconditions.uid (409 when it does not match); the object
  goes at once, as with no kubelet to wait for;
- 404 with a Status object for a missing object (`deployments.apps "x" not found`); 403 with the API server's
  Forbidden Status, in its words, for a verb that `rules` (RBAC PolicyRules: apiGroups, resources, verbs,
  "*" for any) do not grant the service account `user`; 405 for a method the double does not serve;
- every request recorded (`requests`), with its RBAC verb, group and resource, before it is allowed or not;
- `delay`: seconds to wait before each answer, to time the client out.

What it does not do: watches, label selectors, JSON patches, server-side apply, admission, defaulting, any
controller (a Deployment scaled to 0 keeps its pods here until a test removes them), authentication.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SERVICE_ACCOUNT = "system:serviceaccount:gpu-monitoring:gpulens-reclaim"

# (group, version, plural) -> kind, namespaced
RESOURCES: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "nodes"): ("Node", False),
    ("apps", "v1", "replicasets"): ("ReplicaSet", True),
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("apps", "v1", "statefulsets"): ("StatefulSet", True),
    ("batch", "v1", "jobs"): ("Job", True),
    ("kubeflow.org", "v1", "notebooks"): ("Notebook", True),
    ("serving.kserve.io", "v1beta1", "inferenceservices"): ("InferenceService", True),
}
BUILT_IN = {"", "apps", "batch"}  # groups whose objects take a strategic merge patch
SCALABLE = {"deployments", "statefulsets", "replicasets"}
POD_FIELDS = {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"}
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    verb: str  # RBAC's: get, list, patch, delete
    group: str
    resource: str  # with its subresource: "deployments/scale"
    namespace: str
    name: str
    content_type: str
    body: Any


class Refusal(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, dict(details or {})

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


@dataclass
class ApiServer:
    """The objects, the RBAC rules (None: every verb allowed) and the requests of one double."""

    rules: list[dict[str, Any]] | None = None
    user: str = SERVICE_ACCOUNT
    delay: float = 0.0
    requests: list[Request] = field(default_factory=list)
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    url: str = ""
    _version: int = 1000
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- the objects, as tests see them -------------------------------------------------------------

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` (apiVersion, kind, metadata.name; metadata.namespace for a namespaced kind) as created:
        with a UID unless it has one, a resourceVersion and a creationTimestamp. Return the stored object."""
        group, _, version = obj["apiVersion"].rpartition("/")
        plural = next(p for (g, v, p), (kind, _) in RESOURCES.items() if (g, kind) == (group, obj["kind"]))
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-12-05T09:00:00Z")
        with self._lock:
            meta["resourceVersion"] = self._next_version()
            self.objects[(group, plural, meta.get("namespace", ""), meta["name"])] = stored
        return stored

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object of `kind` ("Deployment", "Pod", ...), None when there is none."""
        for key, obj in self.objects.items():
            if obj["kind"] == kind and key[2:] == (namespace, name):
                return obj
        return None

    def remove(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            for key, obj in list(self.objects.items()):
                if obj["kind"] == kind and key[2:] == (namespace, name):
                    del self.objects[key]

    def verbs(self) -> set[tuple[str, str, str]]:
        """(verb, group, resource) of every request made."""
        return {(r.verb, r.group, r.resource) for r in self.requests}

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.verb in ("patch", "delete", "create", "update")]

    # -- serving ------------------------------------------------------------------------------------

    def answer(self, method: str, target: str, content_type: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return 400, Refusal(400, "BadRequest", "the body of the request is not JSON").status()
        try:
            group, version, plural, namespace, name, sub = _route(parts.path)
            verb = _verb(method, name)
            resource = f"{plural}/{sub}" if sub else plural
            with self._lock:
                self.requests.append(
                    Request(method, parts.path, query, verb, group, resource, namespace, name, content_type, body)
                )
            self._authorize(verb, group, plural, resource, namespace, name)
            with self._lock:
                return self._serve(verb, group, version, plural, namespace, name, sub, query, content_type, body)
        except Refusal as refusal:
            return refusal.code, refusal.status()

    def _authorize(self, verb: str, group: str, plural: str, resource: str, namespace: str, name: str) -> None:
        if self.rules is None or any(_grants(rule, verb, group, resource) for rule in self.rules):
            return
        shown = _shown(group, plural)
        what = f'{shown} "{name}"' if name else shown
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        raise Refusal(
            403,
            "Forbidden",
            f'{what} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" in API group "{group}" '
            f"{scope}",
            {"name": name, "group": group, "kind": plural} if name else {"group": group, "kind": plural},
        )

    def _serve(
        self,
        verb: str,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        sub: str,
        query: Mapping[str, str],
        content_type: str,
        body: Any,
    ) -> tuple[int, dict[str, Any]]:
        if verb == "list":
            return 200, self._list(group, version, plural, namespace, query)
        obj = self.objects.get((group, plural, namespace, name))
        if obj is None:
            raise Refusal(
                404,
                "NotFound",
                f'{_shown(group, plural)} "{name}" not found',
                {"name": name, "group": group, "kind": plural},
            )
        if sub == "scale":
            if verb == "patch":
                scale = _patched(_scale(obj), body, content_type, group, plural, obj)
                obj.setdefault("spec", {})["replicas"] = scale["spec"]["replicas"]
                obj["metadata"]["resourceVersion"] = self._next_version()
            return 200, _scale(obj)
        if verb == "get":
            return 200, obj
        if verb == "patch":
            patched = _patched(obj, body, content_type, group, plural, obj)
            patched["metadata"].update({k: obj["metadata"][k] for k in ("uid", "name", "creationTimestamp")})
            if namespace:
                patched["metadata"]["namespace"] = namespace
            patched["metadata"]["resourceVersion"] = self._next_version()
            self.objects[(group, plural, namespace, name)] = patched
            return 200, patched
        # delete
        wanted = ((body or {}).get("preconditions") or {}).get("uid")
        if wanted and wanted != obj["metadata"]["uid"]:
            raise Refusal(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {_shown(group, plural)} "{name}": Precondition failed: '
                f"UID in precondition: {wanted}, UID in object meta: {obj['metadata']['uid']}",
                {"name": name, "group": group, "kind": plural},
            )
        del self.objects[(group, plural, namespace, name)]
        return 200, obj

    def _list(self, group: str, version: str, plural: str, namespace: str, query: Mapping[str, str]) -> dict[str, Any]:
        if "labelSelector" in query:
            raise Refusal(400, "BadRequest", "the double serves no label selector")
        selectors = _field_selectors(query.get("fieldSelector", ""), plural)
        found = sorted(
            (key[2:], obj)
            for key, obj in self.objects.items()
            if key[:2] == (group, plural) and (not namespace or key[2] == namespace)
        )
        items = [obj for _, obj in found if all(_selects(obj, *s) for s in selectors)]
        start = 0
        if query.get("continue"):
            try:
                start = int(base64.urlsafe_b64decode(query["continue"]).decode())
            except ValueError:
                raise Refusal(410, "Expired", "The provided continue parameter is too old or malformed") from None
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self._version)}
        if start + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        kind = RESOURCES[(group, version, plural)][0]
        listed = [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in page]
        return {
            "kind": f"{kind}List",
            "apiVersion": f"{group}/{version}".lstrip("/"),
            "metadata": meta,
            "items": listed,
        }

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)


def _route(path: str) -> tuple[str, str, str, str, str, str]:
    """(group, version, plural, namespace, name, subresource) of an API path."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise Refusal(404, "NotFound", "the server could not find the requested resource")
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3 or (group, version, rest[0]) not in RESOURCES:
        raise Refusal(404, "NotFound", "the server could not find the requested resource")
    plural, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    namespaced = RESOURCES[(group, version, plural)][1]
    if (namespaced and name and not namespace) or (not namespaced and namespace) or (sub and sub != "scale"):
        raise Refusal(404, "NotFound", "the server could not find the requested resource")
    if sub == "scale" and plural not in SCALABLE:
        raise Refusal(404, "NotFound", "the server could not find the requested resource")
    return group, version, plural, namespace, name, sub


def _verb(method: str, name: str) -> str:
    verbs = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}
    if method not in verbs or (method != "GET" and not name):
        raise Refusal(405, "MethodNotAllowed", f"the double does not serve {method} here")
    return verbs[method]


def _grants(rule: Mapping[str, Any], verb: str, group: str, resource: str) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    return has("verbs", verb) and has("apiGroups", group) and has("resources", resource)


def _shown(group: str, plural: str) -> str:
    """How the API server names a resource in its messages: "pods", "deployments.apps"."""
    return f"{plural}.{group}" if group else plural


def _field_selectors(text: str, plural: str) -> list[tuple[str, str, bool]]:
    selectors = []
    for term in filter(None, text.split(",")):
        key, op, value = (
            term.partition("!=") if "!=" in term else term.partition("==") if "==" in term else term.partition("=")
        )
        if not op or (plural == "pods" and key not in POD_FIELDS) or (plural != "pods" and key != "metadata.name"):
            raise Refusal(400, "BadRequest", f"field label not supported: {key}")
        selectors.append((key, value, op == "!="))
    return selectors


def _selects(obj: Mapping[str, Any], key: str, value: str, negated: bool) -> bool:
    found: Any = obj
    for part in key.split("."):
        found = found.get(part) if isinstance(found, Mapping) else None
    return (str(found or "") == value) != negated


def _scale(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    labels = (obj.get("spec", {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")},
        "spec": {"replicas": obj.get("spec", {}).get("replicas", 1)},
        "status": {
            "replicas": obj.get("status", {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


def _patched(
    target: Mapping[str, Any], patch: Any, content_type: str, group: str, plural: str, stored: Mapping[str, Any]
) -> dict[str, Any]:
    """`target` with the merge patch `patch` applied; the API server's refusals of a patch it cannot take."""
    kind = content_type.split(";")[0].strip()
    if kind == STRATEGIC_MERGE_PATCH and group not in BUILT_IN:
        raise Refusal(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    if kind not in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        raise Refusal(415, "UnsupportedMediaType", f"the double applies no {kind or 'untyped'} patch")
    if not isinstance(patch, dict):
        raise Refusal(400, "BadRequest", "a merge patch is a JSON object")
    wanted = (patch.get("metadata") or {}).get("resourceVersion")
    if wanted and wanted != stored["metadata"]["resourceVersion"]:
        raise Refusal(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {_shown(group, plural)} "{stored["metadata"]["name"]}": the object '
            "has been modified; please apply your changes to the latest version and try again",
        )
    return _merge(copy.deepcopy(dict(target)), patch)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: a JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


@contextmanager
def api_server(rules: list[dict[str, Any]] | None = None, user: str = SERVICE_ACCOUNT) -> Iterator[ApiServer]:
    """Serve a new double on a free loopback port until the block ends; its `url` is set."""
    double = ApiServer(rules=rules, user=user)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, body = double.answer(self.command, self.path, self.headers.get("Content-Type", ""), raw)
            time.sleep(double.delay)
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up waiting

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _answer  # noqa: N815 (the names http.server calls)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    double.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()
