"""A real Kubernetes control plane for tests: etcd, kube-apiserver and kube-controller-manager on loopback.

The binaries are built from their Go modules by ``scripts/build_kube.sh`` into
``~/.cache/nstance/kube/<version>/``; ``binaries()`` finds them (``NSTANCE_KUBE_BIN`` names the directory
explicitly, and then it must hold them). ``RealKube`` writes a fresh PKI (cluster CA, serving certificate,
a ``system:masters`` client certificate, the service-account signing key), starts the three processes on
free loopback ports with RBAC and the admission webhooks enabled, waits until ``/readyz`` answers and the
``default`` service account exists, and writes a client-certificate kubeconfig. ``stop()`` ends every
process it started and waits for each, so nothing is left behind; the data directory goes with ``root``.

The controller manager runs only the controllers a bare cluster needs for the API semantics tests rely on
(namespace deletion, garbage collection, service accounts and their tokens, the root CA ConfigMap); no
scheduler and no kubelet run, so pods stay Pending, and no node controller taints nodes.

Nothing in the product imports this module.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nstance.pki.ca import CertificateAuthority, create_ca
from nstance.pki.certs import issue_server_certificate
from nstance.pki.keys import generate_private_key, private_key_to_pem, public_key_to_pem
from nstance.testing.kubeapi.manifests import load_manifests
from nstance.testing.procs import free_port, log_tail, spawn_logged, stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_kube.sh"
BIN_ENV = "NSTANCE_KUBE_BIN"
PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager")
ADMIN_USER = "nstance-admin"
CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
)


def binaries() -> Path | None:
    """The directory holding the built control plane, or None when it has not been built here.

    ``NSTANCE_KUBE_BIN`` wins; when it is set but lacks a binary, that is an error, not a None: a CI run
    that built the binaries must not quietly fall back to skipping the real-server tests.
    """
    explicit = os.environ.get(BIN_ENV)
    if explicit:
        directory = Path(explicit)
        missing = [p for p in PROGRAMS if not os.access(directory / p, os.X_OK)]
        if missing:
            raise FileNotFoundError(f"{BIN_ENV}={explicit} lacks {', '.join(missing)}")
        return directory
    if not BUILD_SCRIPT.is_file():
        return None
    found = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        return None
    return Path(found.stdout.strip().splitlines()[-1])


def capi_binaries() -> Path | None:
    """The folder with ``controller-gen`` and ``clusterctl`` (scripts/build_kube.sh), or None when not built.

    Where ``NSTANCE_KUBE_BIN`` is set the build script has run, so their absence is an error.
    """
    found = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-capi"], capture_output=True, text=True, check=False
    )
    if found.returncode == 0:
        return Path(found.stdout.strip().splitlines()[-1])
    if os.environ.get(BIN_ENV):
        raise FileNotFoundError(
            f"{BIN_ENV} is set but the Cluster API tools are not built (scripts/build_kube.sh)"
        )
    return None


def _client_certificate(ca: CertificateAuthority, user: str, group: str) -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) of a clientAuth certificate whose CN is the user and O the group."""
    key = generate_private_key("ecdsa-p256")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, group),
                    x509.NameAttribute(NameOID.COMMON_NAME, user),
                ]
            )
        )
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    cert = ca.sign(builder)
    return cert.public_bytes(serialization.Encoding.PEM), private_key_to_pem(key)


def kubeconfig_text(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, namespace: str) -> str:
    """A kubeconfig with one context ``nstance-real`` that embeds the CA and the client certificate."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "real", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": ADMIN_USER,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [
            {
                "name": "nstance-real",
                "context": {"cluster": "real", "user": ADMIN_USER, "namespace": namespace},
            }
        ],
        "current-context": "nstance-real",
    }
    return yaml.safe_dump(document, sort_keys=False)


@dataclass
class RealKube:
    """etcd, kube-apiserver and kube-controller-manager under ``root`` (default: a new temporary folder)."""

    bin_dir: Path
    root: Path | None = None
    controller_manager: bool = True
    #: Start the programs in a session of their own. A terminal's Ctrl-C (SIGINT to its whole
    #: foreground process group) then reaches only the program that started them, which stops them
    #: last, after the clients that still need the API: ``make run-k8s`` stops the operator first,
    #: and its Lease release used to fail against an API server already shutting down.
    own_session: bool = False
    apiserver_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    etcd_url: str = ""

    def __post_init__(self) -> None:
        self._own_root = self.root is None
        self.dir = Path(tempfile.mkdtemp(prefix="nstance-kube-")) if self.root is None else self.root

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.dir / "pki" / "ca.crt"

    def log_path(self, program: str) -> Path:
        return self.dir / "logs" / f"{program}.log"

    def log(self, program: str = "kube-apiserver", tail: int = 8000) -> str:
        return log_tail(self.log_path(program), tail)

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> RealKube:
        """Start the processes and wait until they serve; once only (``with RealKube(...)`` starts it:
        a second start would start a second set and lose track of the first)."""
        if self.procs:
            raise RuntimeError("this RealKube is already started (with RealKube(...) starts it)")
        try:
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._wait("kube-apiserver", "/readyz", timeout)
            if self.controller_manager:
                self._start_controller_manager()
                self._wait(
                    "kube-controller-manager", "/api/v1/namespaces/default/serviceaccounts/default", timeout
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM each process (controller manager, API server, etcd, in that order) and reap it."""
        for program in reversed(PROGRAMS):
            proc = self.procs.pop(program, None)
            if proc is not None:
                stop_process(proc, signal.SIGTERM, timeout=15.0)
        if self._own_root:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RealKube:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- parts ---------------------------------------------------------------------------------------

    def _write_pki(self) -> None:
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca = create_ca(common_name="nstance-test-kubernetes-ca", organization="nstance tests")
        serving = issue_server_certificate(
            ca,
            dns_names=["kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ip_addresses=["10.0.0.1"],
        )
        cert_pem, key_pem = _client_certificate(ca, ADMIN_USER, "system:masters")
        sa_key = generate_private_key("ecdsa-p256")  # tokens signed ES256
        files = {
            "ca.crt": ca.cert_pem,
            "ca.key": ca.key_pem,
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": private_key_to_pem(serving.private_key),  # type: ignore[arg-type]
            "admin.crt": cert_pem,
            "admin.key": key_pem,
            "sa.key": private_key_to_pem(sa_key),
            "sa.pub": public_key_to_pem(sa_key),
        }
        for name, data in files.items():
            (pki / name).write_bytes(data)
            (pki / name).chmod(0o600)
        self.kubeconfig.write_text(kubeconfig_text(self.url, ca.cert_pem, cert_pem, key_pem, "default"))
        self.kubeconfig.chmod(0o600)

    def _spawn(self, program: str, args: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "ETCD"))}
        self.procs[program] = spawn_logged(
            [str(self.bin_dir / program), *args], env, self.log_path(program), own_session=self.own_session
        )

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        pki = self.dir / "pki"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                "--allow-privileged=true",
                "--v=1",
            ],
        )

    def _start_controller_manager(self) -> None:
        pki = self.dir / "pki"
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting the cluster CA and presenting the admin certificate."""
        pki = self.dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return context

    def request(self, method: str, path: str, body: object = None) -> tuple[int, str]:
        """One JSON request as the admin: (status, body); (0, error) when nothing answers."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl_context()) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            return 0, str(exc)

    def get(self, path: str) -> tuple[int, str]:
        """GET ``path`` on the API server as the admin."""
        return self.request("GET", path)

    def install_crds(self, paths: Iterable[str | Path], timeout: float = 30.0) -> list[str]:
        """Create the CRDs in the manifests of ``paths`` (kept when already there); wait until each is
        Established. Returns their names."""
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for crd in load_manifests(paths):
            status, text = self.request("POST", base, crd)
            if status not in (201, 409):
                raise RuntimeError(f"creating CRD {crd['metadata']['name']}: {status} {text[:500]}")
            names.append(str(crd["metadata"]["name"]))
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                status, text = self.get(f"{base}/{name}")
                conditions = (
                    (json.loads(text).get("status") or {}).get("conditions") or [] if status == 200 else []
                )
                if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established after {timeout:g}s")
                time.sleep(0.1)
        return names

    def _wait(self, program: str, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; log:\n{self.log(name)}")
            code, body = self.get(path)
            if code == 200:
                return
            last = f"{code} {body[:300]}"
            time.sleep(0.2)
        raise TimeoutError(
            f"{program} not ready after {timeout:g}s (last: {last}); log:\n{self.log(program)}"
        )
