"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, and KWOK for fake nodes whose pods have a lifecycle.

The binaries come from `scripts/build-k8s.sh` (upstream Go modules). Everything here is plain
process and file handling; `conftest.py` turns it into pytest fixtures. Tests reach the cluster
through `KubeCluster` and make simulated nodes with `add_ready_node` (API objects only) or
`add_kwok_node` (KWOK runs their pods).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import ipaddress
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from lightkube import ApiError, AsyncClient, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, ServiceAccount, ServiceAccountToken
from lightkube.types import PatchType

from rdmaplane.adapters.kube import async_client, sync_client
from rdmaplane.services.webhook.policy import certs

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
# The controllers a test cluster needs to restart jobs: the Job controller (podFailurePolicy,
# pod replacement) and taint eviction (NoExecute taints). Others stay off: fewer informers,
# less CPU on a loaded machine, and nothing racing the fixtures (e.g. ServiceAccounts).
DEFAULT_CONTROLLERS = ("job", "taint-eviction-controller")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
STARTUP_TIMEOUT_S = 120.0

# A scheduler configuration given as a mapping or as YAML text.
SchedulerConfig = Mapping[str, Any] | str


class StartError(RuntimeError):
    """A control-plane binary did not come up; the message names it, its flags and its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def poll_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Call `check` every 250 ms until it returns true; `TimeoutError` naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.25)


# SIGKILL the child when pytest dies, so no binary outlives a run. util-linux's setpriv sets
# PR_SET_PDEATHSIG and execs the binary: no Python runs between fork and exec (a preexec_fn
# does, and in a process with gRPC threads the child sometimes aborted before exec).
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


@dataclass
class Process:
    """One running control-plane binary, its flags and its log file."""

    binary: Path
    args: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    url: str = ""  # where it serves HTTPS, for those that do (kube-scheduler: /debug/pprof)

    @classmethod
    def start(cls, binary: Path, args: Sequence[str], log_path: Path) -> Process:
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [*DIE_WITH_PARENT, str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return cls(binary, list(args), log_path, popen)

    @property
    def name(self) -> str:
        return self.binary.name

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start_error(self, why: str) -> StartError:
        return StartError(
            f"{self.name} {why}\n"
            f"  binary: {self.binary}\n"
            f"  flags: {' '.join(self.args)}\n"
            f"  log tail ({self.log_path}):\n{self.log_tail()}"
        )

    def wait_ready(self, probe: Callable[[], bool], timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Poll `probe` until it is true; on failure stop the process and raise `StartError`."""

        def ready() -> bool:
            code = self.popen.poll()
            if code is not None:
                raise self.start_error(f"exited with code {code} before it was ready")
            return probe()

        try:
            poll_until(ready, timeout, f"{self.name} ready")
        except TimeoutError:
            self.stop()
            raise self.start_error(f"was not ready after {timeout:.0f} s") from None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Pki:
    """A throwaway CA that issues serving and client certificates, plus a service-account key."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        ca_pem, key_pem = certs.new_ca(_now(), "rdmaplane-e2e-ca")  # the webhook's own CA maker
        self._ca_cert = x509.load_pem_x509_certificate(ca_pem)
        self._ca_key = serialization.load_pem_private_key(key_pem, password=None)
        assert isinstance(self._ca_key, ec.EllipticCurvePrivateKey)
        self.ca_cert = self._write("ca.crt", self._ca_cert.public_bytes(serialization.Encoding.PEM))
        sa_key = ec.generate_private_key(ec.SECP256R1())
        self.service_account_key = self._write("sa.key", _pem(sa_key))
        self.service_account_public_key = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5))
            .not_valid_after(_now() + dt.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        )

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: Sequence[str] = (),
        hosts: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """Certificate + key files `<name>.crt`/`<name>.key`: a serving cert when `hosts` are
        given (IPs or DNS names), else a client cert for user `common_name` in `organizations`
        (Kubernetes groups)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            self._builder(subject, key.public_key(), issuer=self._ca_cert.subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False
            )
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return (
            self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{name}.key", _pem(key)),
        )


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        return httpx.get(url, verify=context or True, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class KubeCluster:
    """The running test cluster, as tests see it.

    `server` is the API server URL, `kubeconfig` a kubeconfig for a cluster admin
    (`system:masters`). `client()`/`async_client()` return lightkube clients for it (close them, or
    use them as context managers). `kubeconfig_for(user, groups)` writes a kubeconfig that
    authenticates as another user, to test RBAC as a component sees it.
    """

    server: str
    kubeconfig: Path
    pki: Pki
    workdir: Path
    bin_dir: Path

    def client(self) -> Client:
        return sync_client(self.kubeconfig)

    def async_client(self) -> AsyncClient:
        return async_client(self.kubeconfig)

    def create_namespace(self, name: str) -> None:
        """A namespace with its `default` ServiceAccount, which the ServiceAccount admission
        plugin requires of every pod and which, without kube-controller-manager, nobody else
        creates."""
        with self.client() as client:
            client.create(Namespace(metadata=ObjectMeta(name=name)))
            client.create(ServiceAccount(metadata=ObjectMeta(name="default", namespace=name)))

    def kubeconfig_for(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as `user` in `groups` by a client certificate."""
        file_name = user.replace(":", "-")
        cert, key = self.pki.issue(file_name, user, groups)
        return write_kubeconfig(
            self.workdir / f"{file_name}.kubeconfig", self.server, self.pki.ca_cert, cert, key
        )

    def kubeconfig_for_pod(self, pod: Mapping[str, Any]) -> Path:
        """A kubeconfig with a token of the pod's ServiceAccount bound to the pod, as the
        kubelet mounts one: for a pod bound to a node the API server names that node in it
        (user extra `authentication.kubernetes.io/node-name`). The pod is created here (it
        need not run); deleting it invalidates the token."""
        meta = pod["metadata"]
        with self.client() as client:
            created = client.create(codecs.from_dict(dict(pod)))
            assert created.metadata is not None
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {},
                "spec": {
                    "audiences": [],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": created.metadata.uid,
                    },
                },
            }
            token = client.create(
                ServiceAccountToken.from_dict(request),
                pod["spec"]["serviceAccountName"],
                namespace=meta["namespace"],
            )
        assert token.status is not None
        path = self.workdir / f"{meta['namespace']}-{meta['name']}.kubeconfig"
        return write_kubeconfig(path, self.server, self.pki.ca_cert, token=token.status.token)

    def tls_context(self) -> ssl.SSLContext:
        """Trusts the cluster CA and presents the admin certificate (for raw HTTPS probes)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        user = config["users"][0]["user"]
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(user["client-certificate"], user["client-key"])
        return context


async def add_ready_node(
    kube: AsyncClient, name: str, labels: Mapping[str, str], extended: Mapping[str, str]
) -> None:
    """A Node as a kubelet with device plugins and the node lifecycle controller leave it:
    Ready, with room for pods and the `extended` resources (e.g. `{"nvidia.com/gpu": "8"}`) in
    capacity and allocatable, and without the `not-ready` taint that admission puts on new
    nodes (no kube-controller-manager runs here to lift it)."""
    await kube.create(Node(metadata=ObjectMeta(name=name, labels=dict(labels))))
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **extended}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    status = {"capacity": resources, "allocatable": resources, "conditions": [ready]}
    await kube.patch(Node.Status, name, {"status": status})
    await kube.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig for `server` authenticating by a client certificate (`cert`, `key`) or a
    bearer `token`."""
    user = (
        {"token": token}
        if token is not None
        else {"client-certificate": str(cert), "client-key": str(key)}
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def start_etcd(bin_dir: Path, workdir: Path) -> tuple[Process, str]:
    """etcd on loopback over plain HTTP (only the API server talks to it)."""
    client_url = f"http://127.0.0.1:{free_port()}"
    peer_url = f"http://127.0.0.1:{free_port()}"
    process = Process.start(
        bin_dir / "etcd",
        [
            "--name=e2e",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--unsafe-no-fsync",  # throwaway data: skip fsync, the slowest part on small disks
            "--log-level=warn",
        ],
        workdir / "etcd.log",
    )
    process.wait_ready(lambda: _http_ok(f"{client_url}/health"))
    return process, client_url


def start_apiserver(
    bin_dir: Path, workdir: Path, etcd_url: str, extra_args: Sequence[str] = ()
) -> tuple[Process, KubeCluster]:
    """kube-apiserver with client-cert authentication, Node+RBAC authorization, an admin
    kubeconfig, and the default admission plugins; `extra_args` after the flags here (e.g.
    `--admission-control-config-file`)."""
    pki = Pki(workdir)
    service_ip = str(next(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).hosts()))
    serving_cert, serving_key = pki.issue(
        "apiserver", "kube-apiserver", hosts=["127.0.0.1", "localhost", service_ip, "kubernetes"]
    )
    admin_cert, admin_key = pki.issue("admin", "rdmaplane-e2e-admin", ["system:masters"])
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    cluster = KubeCluster(
        server=server,
        kubeconfig=write_kubeconfig(
            workdir / "admin.kubeconfig", server, pki.ca_cert, admin_cert, admin_key
        ),
        pki=pki,
        workdir=workdir,
        bin_dir=bin_dir,
    )
    process = Process.start(
        bin_dir / "kube-apiserver",
        [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={serving_cert}",
            f"--tls-private-key-file={serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.service_account_public_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            # The `kubernetes` Service endpoints may not point at loopback; nothing here uses them.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",  # the rdmaplane agent DaemonSet is privileged
            "--profiling=false",
            *extra_args,
        ],
        workdir / "kube-apiserver.log",
    )
    context = cluster.tls_context()
    process.wait_ready(lambda: _http_ok(f"{server}/readyz", context))
    return process, cluster


def scheduler_configuration(config: SchedulerConfig | None, kubeconfig: Path) -> dict[str, Any]:
    """The given KubeSchedulerConfiguration, passed through untouched except for defaults the
    test cluster needs where it leaves them out: apiVersion/kind, the client kubeconfig, and no
    leader election (one scheduler, started and stopped per test)."""
    loaded = yaml.safe_load(config) if isinstance(config, str) else copy.deepcopy(config)
    result: dict[str, Any] = dict(loaded or {})
    result.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
    result.setdefault("kind", "KubeSchedulerConfiguration")
    result.setdefault("clientConnection", {}).setdefault("kubeconfig", str(kubeconfig))
    result.setdefault("leaderElection", {}).setdefault("leaderElect", False)
    return result


def launch_scheduler(
    cluster: KubeCluster, config: SchedulerConfig | None = None, args: Sequence[str] = ()
) -> Process:
    """kube-scheduler running as `system:kube-scheduler` (its default RBAC role) with `config`
    and further flags `args` (e.g. `--feature-gates`).

    Ready means /readyz is 200, which includes the informer caches having synced.
    """
    kubeconfig = cluster.kubeconfig_for("system:kube-scheduler")
    serving_cert, serving_key = cluster.pki.issue(
        "scheduler", "kube-scheduler", hosts=["127.0.0.1"]
    )
    with tempfile.NamedTemporaryFile(
        "w", dir=cluster.workdir, prefix="scheduler-", suffix=".yaml", delete=False
    ) as file:
        yaml.safe_dump(scheduler_configuration(config, kubeconfig), file)
    port = free_port()
    process = Process.start(
        cluster.bin_dir / "kube-scheduler",
        [
            f"--config={file.name}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={serving_cert}",
            f"--tls-private-key-file={serving_key}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            *args,
        ],
        Path(file.name).with_suffix(".log"),
    )
    process.url = f"https://127.0.0.1:{port}"
    context = cluster.tls_context()
    process.wait_ready(lambda: _http_ok(f"{process.url}/readyz", context))
    return process


def launch_controller_manager(
    cluster: KubeCluster, controllers: Sequence[str] = DEFAULT_CONTROLLERS, args: Sequence[str] = ()
) -> Process:
    """kube-controller-manager running `controllers` with the admin's credentials (its own RBAC
    is not under test; with one identity no per-controller ServiceAccount tokens are needed),
    and further flags `args` (e.g. `--kube-api-qps`). Ready when /healthz answers 200."""
    serving_cert, serving_key = cluster.pki.issue(
        "controller-manager", "kube-controller-manager", hosts=["127.0.0.1"]
    )
    port = free_port()
    process = Process.start(
        cluster.bin_dir / "kube-controller-manager",
        [
            f"--kubeconfig={cluster.kubeconfig}",
            f"--authentication-kubeconfig={cluster.kubeconfig}",
            f"--authorization-kubeconfig={cluster.kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--root-ca-file={cluster.pki.ca_cert}",  # what root-ca-cert-publisher publishes
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={serving_cert}",
            f"--tls-private-key-file={serving_key}",
            "--profiling=false",
            *args,
        ],
        cluster.workdir / f"kube-controller-manager-{port}.log",
    )
    context = cluster.tls_context()
    process.wait_ready(lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context))
    return process


def launch_kwok(
    cluster: KubeCluster, kwok_bin: Path, stages: Path = KWOK_STAGES, *extra: str
) -> Process:
    """KWOK managing the nodes annotated `kwok.x-k8s.io/node=fake` with `stages` (our own stage
    set, `kwok-stages.yaml`: nodes become Ready, bound pods Running, evicted or deleted pods
    Failed and then gone). Ready when its /healthz answers 200."""
    port = free_port()
    process = Process.start(
        kwok_bin,
        [
            f"--kubeconfig={cluster.kubeconfig}",
            f"--config={stages}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{port}",
            "--node-ip=127.0.0.1",
            *extra,
        ],
        cluster.workdir / f"kwok-{port}.log",
    )
    process.wait_ready(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"))
    return process


async def create_kwok_node(
    kube: AsyncClient,
    name: str,
    labels: Mapping[str, str],
    extended: Mapping[str, str],
    conditions: Sequence[Mapping[str, str]] = (),
) -> None:
    """Create a Node that KWOK manages (its pods start and stop), with its capacity (and any
    `conditions` besides Ready, e.g. `RDMAReady`) in the create body's status: kwok keeps them
    and merges its own conditions by type. The `not-ready` taint admission puts on new nodes is
    lifted (no node lifecycle controller runs here); KWOK's node stage makes it Ready."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **extended}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": dict(labels),
            "annotations": {KWOK_ANNOTATION: "fake"},
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [dict(c) for c in conditions],
        },
    }
    await kube.create(Node.from_dict(body))
    await kube.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)


def kwok_node_ready(node: Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


async def delete_if_there(kube: AsyncClient, kind: Any, name: str, **options: Any) -> None:
    """Delete `name`; already gone (deleted meanwhile, by a controller or a collection
    delete) counts as done, any other refusal is raised."""
    try:
        await kube.delete(kind, name, **options)
    except ApiError as e:
        if e.status.code != 404:
            raise


async def add_kwok_node(
    kube: AsyncClient, name: str, labels: Mapping[str, str], extended: Mapping[str, str]
) -> None:
    """`create_kwok_node`, returning once KWOK made it Ready."""
    await create_kwok_node(kube, name, labels, extended)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not kwok_node_ready(await kube.get(Node, name)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"KWOK did not make node {name} Ready")
        await asyncio.sleep(0.1)


def launch_extender(
    cluster: KubeCluster, kubeconfig: Path, port: int, *extra: str, ready: bool = True
) -> Process:
    """`rdmaplane scheduler-extender` as it is deployed: its own process, reading the cluster
    with `kubeconfig`, serving on 127.0.0.1:`port`. With `ready`, returns once its /readyz
    answers 200 (every watch has listed once)."""
    process = Process.start(
        Path(sys.executable),
        [
            "-m",
            "rdmaplane",
            "scheduler-extender",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--kubeconfig={kubeconfig}",
            *extra,
        ],
        cluster.workdir / f"extender-{port}-{time.monotonic_ns()}.log",
    )
    if ready:
        process.wait_ready(lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"))
    return process


BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-k8s.sh"


def build_dir(*flags: str) -> Path:
    """The folder `scripts/build-k8s.sh FLAGS` names (`--bin-dir`, `--kwok-bin-dir`, `node
    --bin-dir`); builds nothing."""
    found = subprocess.run([str(BUILD_SCRIPT), *flags], capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def missing_binaries(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not (bin_dir / b).is_file()]


@contextlib.contextmanager
def control_plane(
    bin_dir: Path, apiserver_args: Callable[[Path], Sequence[str]] = lambda _: ()
) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver in a temporary folder; both stopped and the folder removed on exit,
    whatever happened inside. `apiserver_args(workdir)` gives further kube-apiserver flags (it
    may write the files they name into the folder)."""
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rdmaplane-e2e-")))
        etcd, etcd_url = start_etcd(bin_dir, workdir)
        stack.callback(etcd.stop)
        apiserver, cluster = start_apiserver(bin_dir, workdir, etcd_url, apiserver_args(workdir))
        stack.callback(apiserver.stop)
        with cluster.client() as client:
            client.create(ServiceAccount(metadata=ObjectMeta(name="default", namespace="default")))
        yield cluster
