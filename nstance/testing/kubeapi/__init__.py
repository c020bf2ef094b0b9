"""An in-memory Kubernetes API server emulator for tests; kopf, kubernetes_asyncio and kubectl run unmodified.

Usage::

    from nstance.testing.kubeapi import KubeAPIServer

    async with KubeAPIServer(crds=["config/crd"]) as server:   # binds 127.0.0.1 on a free port
        server.url                                            # "http://127.0.0.1:PORT"
        server.write_kubeconfig(tmp_path / "kubeconfig")      # context "emulator", namespace default

    with KubeAPIServer.in_thread() as server: ...             # for sync tests
    python -m nstance.testing.kubeapi --port 0 --crds DIR --kubeconfig OUT   # subprocess; prints {"url": ...}

The package is test support: it must never listen beyond loopback by default, persist anything, or be
imported by production code paths.
"""

from nstance.testing.kubeapi.errors import APIError
from nstance.testing.kubeapi.server import KubeAPIServer
from nstance.testing.kubeapi.store import Store, WatchEvent

__all__ = ["APIError", "KubeAPIServer", "Store", "WatchEvent"]
