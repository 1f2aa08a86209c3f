"""A small Compute Engine REST server for tests and the benchmark (Compute has no emulator anywhere).

It speaks the real JSON wire format to the real google-cloud-compute clients (pointed here with
client_options + AnonymousCredentials): regions.get with quotas; instances insert/get/delete/
getShieldedInstanceIdentity; zoneOperations get/wait; firewalls insert/get/delete with globalOperations;
images insert/get/delete (the import reads rawDisk.source from the Cloud Storage emulator when one is given);
instances aggregatedList (label filter), and Resource Manager's projects.testIamPermissions. Instances
keep what was inserted (guestAccelerators, scheduling, local SSD disks, labels). It behaves like the real
API where our code depends on it:
- an insert with a requestId already seen returns the SAME operation and makes nothing new;
- an insert of an existing name answers HTTP 409 (reason alreadyExists);
- a zone set to fail ends its operation DONE with an error (QUOTA_EXCEEDED + httpErrorStatusCode 403,
  ZONE_RESOURCE_POOL_EXHAUSTED or STOCKOUT + 503), as Compute reports capacity problems on the operation;
  `insert_errors` refuses the insert call itself with that reason instead;
- operations run for `op_duration_s`; `wait` long-polls up to `wait_max_s` (Compute: ~2 minutes).
Every request is counted in `calls` so tests and the benchmark can check how the client behaves."""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

EK_PEM = (
    "-----BEGIN PUBLIC KEY-----\n"
    "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAfakeEKfakeEKfakeEKfakeEKfakeEKfakeEKfake\n"
    "-----END PUBLIC KEY-----\n"
)

ZONE_ERRORS = {
    "QUOTA_EXCEEDED": (
        403,
        "FORBIDDEN",
        "Quota 'LOCAL_SSD_TOTAL_GB' exceeded. Limit: 0.0 in region {region}.",
    ),
    "ZONE_RESOURCE_POOL_EXHAUSTED": (
        503,
        "SERVICE UNAVAILABLE",
        "The zone '{zone}' does not have enough resources available to fulfill the request.",
    ),
    "STOCKOUT": (
        503,
        "SERVICE UNAVAILABLE",
        "The zone '{zone}' is out of the requested resource (stockout); try another zone.",
    ),
}


@dataclass
class _Op:
    name: str
    zone: str | None  # None = global
    op_type: str
    target: str
    started: float
    duration: float
    error: str | None = None
    on_done: Any = None
    finished: bool = False


@dataclass
class FakeCompute:
    """State of the fake project; tests tune the public fields."""

    project: str = "rigbase-test"
    region_quotas: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    zone_errors: dict[str, str] = field(
        default_factory=dict
    )  # zone -> QUOTA_EXCEEDED | ZONE_RESOURCE_POOL_EXHAUSTED | STOCKOUT (on the operation)
    # zone -> reason refused on the insert call itself (HTTP 403/503 with that reason), as Compute answers
    # some quota checks before any operation exists
    insert_errors: dict[str, str] = field(default_factory=dict)
    op_duration_s: float = 0.05
    wait_max_s: float = 2.0
    granted_permissions: set[str] | None = None  # None = testIamPermissions not offered (404)
    latency_s: float = 0.0  # added to every answer, to model a WAN round trip in the benchmark
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    # called with the route's name after the request was handled, before the answer leaves: a test can
    # kill the control plane here ("Compute did it, the caller never heard back")
    on_call: Any = None
    ek_pems: dict[tuple[str, str], str] = field(default_factory=dict)  # each VM's own vTPM EK
    # the vTPM EKs the next VMs get, in order (a test's swtpm, so a real minion can join as that VM);
    # when empty, each VM gets a fresh key
    next_ek_pems: list[str] = field(default_factory=list)
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the Cloud Storage emulator images.insert reads rawDisk.source from (None: every import succeeds)
    storage_url: str | None = None
    call_log: list[tuple[float, str]] = field(default_factory=list)
    _ops: dict[str, _Op] = field(default_factory=dict)
    _by_request_id: dict[str, str] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1000))
    lock: threading.RLock = field(default_factory=threading.RLock)

    # --- operations ------------------------------------------------------------------------------
    def _new_op(
        self, zone: str | None, op_type: str, target: str, on_done: Any, error: str | None = None
    ) -> _Op:
        op = _Op(
            name=f"operation-{next(self._ids)}-{op_type}",
            zone=zone,
            op_type=op_type,
            target=target,
            started=time.monotonic(),
            duration=0.0 if error else self.op_duration_s,
            error=error,
            on_done=on_done,
        )
        self._ops[op.name] = op
        return op

    def _settle(self, op: _Op) -> bool:
        """Finish the operation once its time is up (running its effect exactly once)."""
        if not op.finished and time.monotonic() - op.started >= op.duration:
            op.finished = True
            if op.error is None and op.on_done:
                op.on_done()
        return op.finished

    def _op_json(self, op: _Op) -> dict[str, Any]:
        done = self._settle(op)
        base = f"https://compute.googleapis.com/compute/v1/projects/{self.project}"
        where = f"{base}/zones/{op.zone}" if op.zone else f"{base}/global"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(abs(hash(op.name)) % 10**18),
            "name": op.name,
            "operationType": op.op_type,
            "targetLink": op.target,
            "status": "DONE" if done else "RUNNING",
            "progress": 100 if done else 50,
            "selfLink": f"{where}/operations/{op.name}",
        }
        if op.zone:
            body["zone"] = f"{base}/zones/{op.zone}"
        if done and op.error:
            status, text, message = ZONE_ERRORS[op.error]
            region = op.zone.rsplit("-", 1)[0] if op.zone else ""
            body["error"] = {
                "errors": [{"code": op.error, "message": message.format(zone=op.zone, region=region)}]
            }
            body["httpErrorStatusCode"] = status
            body["httpErrorMessage"] = text
        return body

    def instance_count(self, name: str | None = None) -> int:
        with self.lock:
            return sum(1 for (_z, n) in self.instances if name is None or n == name)


def new_ek_pem() -> str:
    """A fresh RSA-2048 public key in PEM, as getShieldedInstanceIdentity returns a vTPM's EK."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def _error(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"domain": "global", "reason": reason, "message": message}],
        }
    }


def region_get(fake: FakeCompute, q: dict, body: dict, p: str, region: str) -> Any:
    if region not in fake.region_quotas:
        return _error(404, "notFound", f"The resource 'projects/{p}/regions/{region}' was not found")
    zones = [f"https://compute.googleapis.com/compute/v1/projects/{p}/zones/{region}-{z}" for z in "abc"]
    return 200, {
        "kind": "compute#region",
        "name": region,
        "status": "UP",
        "zones": zones,
        "quotas": fake.region_quotas[region],
    }


def instance_insert(fake: FakeCompute, q: dict, body: dict, p: str, zone: str) -> Any:
    rid = q.get("requestId")
    if rid and rid in fake._by_request_id:  # same requestId -> same operation, nothing new
        return 200, fake._op_json(fake._ops[fake._by_request_id[rid]])
    name = body["name"]
    target = f"https://compute.googleapis.com/compute/v1/projects/{p}/zones/{zone}/instances/{name}"
    pending = any(
        o.target == target and o.op_type == "insert" and not fake._settle(o) for o in fake._ops.values()
    )
    if (zone, name) in fake.instances or pending:  # Compute also refuses a name whose insert is in flight
        return _error(
            409, "alreadyExists", f"The resource 'projects/{p}/zones/{zone}/instances/{name}' already exists"
        )
    refused = fake.insert_errors.get(zone)
    if refused:
        status, _text, message = ZONE_ERRORS[refused]
        return _error(status, refused, message.format(zone=zone, region=zone.rsplit("-", 1)[0]))
    error = fake.zone_errors.get(zone)

    def materialise() -> None:
        inst = dict(body)
        inst.update(
            id=str(next(fake._ids)),
            zone=f"https://compute.googleapis.com/compute/v1/projects/{p}/zones/{zone}",
            status="RUNNING",
            selfLink=target,
            kind="compute#instance",
        )
        fake.instances[(zone, name)] = inst
        fake.ek_pems[(zone, name)] = fake.next_ek_pems.pop(0) if fake.next_ek_pems else new_ek_pem()

    op = fake._new_op(zone, "insert", target, materialise, error)
    if rid:
        fake._by_request_id[rid] = op.name
    return 200, fake._op_json(op)


def instance_get(fake: FakeCompute, q: dict, body: dict, p: str, zone: str, name: str) -> Any:
    for op in list(fake._ops.values()):
        fake._settle(op)
    inst = fake.instances.get((zone, name))
    if inst is None:
        return _error(
            404, "notFound", f"The resource 'projects/{p}/zones/{zone}/instances/{name}' was not found"
        )
    return 200, inst


def instance_delete(fake: FakeCompute, q: dict, body: dict, p: str, zone: str, name: str) -> Any:
    if (zone, name) not in fake.instances:
        return _error(
            404, "notFound", f"The resource 'projects/{p}/zones/{zone}/instances/{name}' was not found"
        )
    target = f"https://compute.googleapis.com/compute/v1/projects/{p}/zones/{zone}/instances/{name}"
    op = fake._new_op(zone, "delete", target, lambda: fake.instances.pop((zone, name), None))
    return 200, fake._op_json(op)


def _label_filter(text: str) -> dict[str, str]:
    """`labels.K=V AND labels.K2=V2` (the only filter form our code sends) → {K: V, K2: V2}."""
    out: dict[str, str] = {}
    for term in text.split(" AND ") if text else []:
        key, _, value = term.strip().partition("=")
        if key.startswith("labels."):
            out[key.removeprefix("labels.")] = value
    return out


def instance_aggregated_list(fake: FakeCompute, q: dict, body: dict, p: str) -> Any:
    for op in list(fake._ops.values()):
        fake._settle(op)
    wanted = _label_filter(q.get("filter", ""))
    items: dict[str, dict[str, Any]] = {}
    for (zone, _name), inst in sorted(fake.instances.items()):
        labels = inst.get("labels") or {}
        if all(labels.get(k) == v for k, v in wanted.items()):
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
    return 200, {
        "kind": "compute#instanceAggregatedList",
        "id": f"projects/{p}/aggregated/instances",
        "items": items,
    }


def shielded_identity(fake: FakeCompute, q: dict, body: dict, p: str, zone: str, name: str) -> Any:
    inst = fake.instances.get((zone, name))
    if inst is None:
        return _error(
            404, "notFound", f"The resource 'projects/{p}/zones/{zone}/instances/{name}' was not found"
        )
    return 200, {
        "kind": "compute#shieldedInstanceIdentity",
        "encryptionKey": {"ekPub": fake.ek_pems.get((zone, name), EK_PEM)},
        "signingKey": {"ekPub": fake.ek_pems.get((zone, name), EK_PEM)},
    }


def op_get(fake: FakeCompute, q: dict, body: dict, p: str, op: str, zone: str | None = None) -> Any:
    o = fake._ops.get(op)
    if o is None:
        return _error(404, "notFound", f"The resource 'operations/{op}' was not found")
    return 200, fake._op_json(o)


def op_wait(fake: FakeCompute, q: dict, body: dict, p: str, op: str, zone: str | None = None) -> Any:
    o = fake._ops.get(op)
    if o is None:
        return _error(404, "notFound", f"The resource 'operations/{op}' was not found")
    deadline = time.monotonic() + fake.wait_max_s
    fake.lock.release()  # long poll without blocking other requests
    try:
        while time.monotonic() < deadline:
            with fake.lock:
                if fake._settle(o):
                    break
            time.sleep(0.005)
    finally:
        fake.lock.acquire()
    return 200, fake._op_json(o)


def firewall_insert(fake: FakeCompute, q: dict, body: dict, p: str) -> Any:
    name = body["name"]
    if name in fake.firewalls:
        return _error(
            409, "alreadyExists", f"The resource 'projects/{p}/global/firewalls/{name}' already exists"
        )
    target = f"https://compute.googleapis.com/compute/v1/projects/{p}/global/firewalls/{name}"
    op = fake._new_op(
        None, "insert", target, lambda: fake.firewalls.__setitem__(name, dict(body, selfLink=target))
    )
    return 200, fake._op_json(op)


def firewall_get(fake: FakeCompute, q: dict, body: dict, p: str, name: str) -> Any:
    for op in list(fake._ops.values()):
        fake._settle(op)
    fw = fake.firewalls.get(name)
    return (
        (200, fw)
        if fw
        else _error(404, "notFound", f"The resource 'projects/{p}/global/firewalls/{name}' was not found")
    )


def firewall_delete(fake: FakeCompute, q: dict, body: dict, p: str, name: str) -> Any:
    if name not in fake.firewalls:
        return _error(404, "notFound", f"The resource 'projects/{p}/global/firewalls/{name}' was not found")
    op = fake._new_op(None, "delete", name, lambda: fake.firewalls.pop(name, None))
    return 200, fake._op_json(op)


def _import_check(fake: FakeCompute, source: str) -> str | None:
    """What images.insert's import finds wrong with rawDisk.source, read from the storage emulator: the
    object must exist and be a gzip'd tar whose only member is disk.raw, a whole number of GiB."""
    import gzip
    import tarfile
    import urllib.error
    import urllib.request
    from urllib.parse import quote

    if fake.storage_url is None:
        return None
    prefix = "https://storage.googleapis.com/"
    if not source.startswith(prefix):
        return f"rawDisk.source {source} is not a Cloud Storage URL"
    bucket, _, obj = source[len(prefix) :].partition("/")
    url = f"{fake.storage_url}/storage/v1/b/{bucket}/o/{quote(obj, safe='')}?alt=media"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            with tarfile.open(fileobj=gzip.GzipFile(fileobj=resp), mode="r|") as tar:
                members = [(m.name, m.size) for m in tar]
    except (urllib.error.URLError, OSError, tarfile.TarError) as exc:
        return f"cannot read {source} as a gzip'd tar: {exc}"
    if len(members) != 1 or members[0][0] != "disk.raw" or members[0][1] % 2**30:
        return f"{source} must hold disk.raw alone, a whole number of GiB: it holds {members}"
    return None


def image_insert(fake: FakeCompute, q: dict, body: dict, p: str) -> Any:
    rid = q.get("requestId")
    if rid and rid in fake._by_request_id:
        return 200, fake._op_json(fake._ops[fake._by_request_id[rid]])
    name = body["name"]
    if name in fake.images:
        return _error(
            409, "alreadyExists", f"The resource 'projects/{p}/global/images/{name}' already exists"
        )
    target = f"https://compute.googleapis.com/compute/v1/projects/{p}/global/images/{name}"
    image = dict(body, id=str(next(fake._ids)), status="PENDING", selfLink=target, kind="compute#image")
    fake.images[name] = image

    def imported() -> None:
        problem = _import_check(fake, body.get("rawDisk", {}).get("source", ""))
        image["status"] = "FAILED" if problem else "READY"
        if problem:
            image["description"] = problem

    op = fake._new_op(None, "insert", target, imported)
    if rid:
        fake._by_request_id[rid] = op.name
    return 200, fake._op_json(op)


def image_get(fake: FakeCompute, q: dict, body: dict, p: str, name: str) -> Any:
    for op in list(fake._ops.values()):
        fake._settle(op)
    image = fake.images.get(name)
    if image is None:
        return _error(404, "notFound", f"The resource 'projects/{p}/global/images/{name}' was not found")
    return 200, image


def image_delete(fake: FakeCompute, q: dict, body: dict, p: str, name: str) -> Any:
    if fake.images.pop(name, None) is None:
        return _error(404, "notFound", f"The resource 'projects/{p}/global/images/{name}' was not found")
    target = f"https://compute.googleapis.com/compute/v1/projects/{p}/global/images/{name}"
    return 200, fake._op_json(fake._new_op(None, "delete", target, None))


def test_permissions(fake: FakeCompute, q: dict, body: dict, p: str) -> Any:
    if fake.granted_permissions is None:
        return _error(404, "notFound", "Requested entity was not found.")
    asked = body.get("permissions", [])
    granted = [x for x in asked if x in fake.granted_permissions]
    return 200, ({"permissions": granted} if granted else {})


_P = r"^/compute/v1/projects/(?P<p>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], Any]] = [
    (method, re.compile(pattern), fn)
    for method, pattern, fn in [
        ("GET", _P + r"/regions/(?P<region>[^/]+)$", region_get),
        ("GET", _P + r"/aggregated/instances$", instance_aggregated_list),
        ("POST", _Z + r"/instances$", instance_insert),
        ("GET", _Z + r"/instances/(?P<name>[^/]+)$", instance_get),
        ("DELETE", _Z + r"/instances/(?P<name>[^/]+)$", instance_delete),
        ("GET", _Z + r"/instances/(?P<name>[^/]+)/getShieldedInstanceIdentity$", shielded_identity),
        ("GET", _Z + r"/operations/(?P<op>[^/]+)$", op_get),
        ("POST", _Z + r"/operations/(?P<op>[^/]+)/wait$", op_wait),
        ("POST", _P + r"/global/images$", image_insert),
        ("GET", _P + r"/global/images/(?P<name>[^/]+)$", image_get),
        ("DELETE", _P + r"/global/images/(?P<name>[^/]+)$", image_delete),
        ("POST", _P + r"/global/firewalls$", firewall_insert),
        ("GET", _P + r"/global/firewalls/(?P<name>[^/]+)$", firewall_get),
        ("DELETE", _P + r"/global/firewalls/(?P<name>[^/]+)$", firewall_delete),
        ("GET", _P + r"/global/operations/(?P<op>[^/]+)$", op_get),
        ("POST", _P + r"/global/operations/(?P<op>[^/]+)/wait$", op_wait),
        ("POST", r"^/v1/projects/(?P<p>[^/:]+):testIamPermissions$", test_permissions),
    ]
]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: Any) -> None:  # keep pytest output clean
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body leave in two writes: without NODELAY, delayed ACK adds 40 ms to every call
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        fake = self.server.fake
        if fake.latency_s:
            time.sleep(fake.latency_s)
        route = None
        for m, pattern, fn in ROUTES:
            match = pattern.match(url.path)
            if m == method and match:
                route = fn.__name__
                with fake.lock:
                    fake.calls[route] += 1
                    fake.call_log.append((time.monotonic(), route))
                    status, payload = fn(fake, query, body, **match.groupdict())
                break
        else:
            status, payload = _error(404, "notFound", f"no route for {method} {url.path}")
        if fake.on_call is not None and route is not None:
            fake.on_call(route)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeCompute

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client killed mid-request (the crash tests do it on purpose)
        super().handle_error(request, client_address)


class FakeComputeServer:
    """Runs a FakeCompute on 127.0.0.1 (port 0 = a free one) in a background thread."""

    def __init__(self, fake: FakeCompute | None = None, port: int = 0) -> None:
        self.fake = fake or FakeCompute()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.fake = self.fake
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-compute", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeComputeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


def quota(metric: str, limit: float, usage: float = 0) -> dict[str, Any]:
    return {"metric": metric, "limit": limit, "usage": usage}
