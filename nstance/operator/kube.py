"""The operator's typed door to the Kubernetes API, on kubernetes_asyncio's ``ApiClient``.

Every object is a plain ``dict`` (the JSON the API server speaks), addressed by a ``Resource``
(group, version, plural, namespaced). ``Kube`` offers what the controllers, sync manager and drain
coordinator need and nothing else: get (None when absent), list with label/field selectors, create,
merge or JSON patch (also on the ``status`` subresource), delete (False when already gone), pod
eviction, service-account tokens (TokenRequest), watch as an async iterator of ``(type, object)``, and
Kubernetes Events on an object.

The HTTP session does not read proxy settings or ``~/.netrc`` from the environment (aiohttp's
``trust_env``, which kubernetes_asyncio turns on): with it on, every request looked up the proxy
variables and tried to open ``~/.netrc``, time spent on each of the operator's calls. A proxy named in
the kubeconfig (``proxy-url``) is still used; ``HTTPS_PROXY``/``NO_PROXY`` are not, like kopf's own
client (its ``networking.trust_env`` defaults to off). Requests carry the User-Agent
``nstance-operator`` (or the one given), so API server audit logs and metrics name the caller.

API errors become ``KubeError`` with the HTTP status, the Status ``reason`` and its message, so callers
branch on ``exc.status`` (404, 409, 422, 429) instead of parsing text. This module holds no operator
policy: it never retries, never caches and never decides what to write.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from nstance.operator.yamltext import YamlFileError, read_yaml_mapping

log = logging.getLogger(__name__)

Object = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
_AUTH: Final = ["BearerToken"]
_OBJECT: Final = {200: "object", 201: "object", 202: "object"}
USER_AGENT: Final = "nstance-operator"
_READ_BUFSIZE: Final = 2**21
"""kubernetes_asyncio's read buffer: watch events of large objects exceed aiohttp's default."""


@dataclass(frozen=True)
class Resource:
    """One kind of object on the API server: ``group`` is "" for the core API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS: Final = Resource("", "v1", "pods", "Pod")
EVENTS: Final = Resource("", "v1", "events", "Event")
SECRETS: Final = Resource("", "v1", "secrets", "Secret")
SERVICE_ACCOUNTS: Final = Resource("", "v1", "serviceaccounts", "ServiceAccount")
CONFIGMAPS: Final = Resource("", "v1", "configmaps", "ConfigMap")
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease")


class KubeError(Exception):
    """A refused Kubernetes API call: HTTP ``status``, Status ``reason`` and the server's message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def _error(exc: ApiException) -> KubeError:
    status = int(exc.status or 0)
    reason, message = str(exc.reason or ""), str(exc.body or exc.reason or "")
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict):
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or message)
    return KubeError(status, reason, message)


def ref_of(obj: Mapping[str, Any]) -> Object:
    """An ``ownerReferences``/``involvedObject``-style reference to ``obj``."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }


def owner_reference(owner: Mapping[str, Any], *, controller: bool = True) -> Object:
    """An owner reference to ``owner`` for a dependent (garbage-collected with it)."""
    return {**ref_of(owner), "controller": controller, "blockOwnerDeletion": True}


DEFAULT_KUBECONFIG: Final = "~/.kube/config"


def kubeconfig_files(kubeconfig: str | None) -> list[Path]:
    """The kubeconfig files ``kubeconfig`` names (a list separated by ``os.pathsep``, as
    ``$KUBECONFIG`` may be), or ``~/.kube/config`` when it names none."""
    named = [part for part in (kubeconfig or "").split(os.pathsep) if part]
    return [Path(part).expanduser() for part in named or [DEFAULT_KUBECONFIG]]


def check_kubeconfig_files(files: Sequence[Path]) -> None:
    """Raise ``ConfigException`` with a plain reason unless the files can make a kubeconfig: one file
    must be a readable YAML mapping; of several, missing ones are skipped (as kubectl skips them)
    but one at least must exist, and every one that exists must be readable."""
    present = [f for f in files if len(files) == 1 or f.exists()]
    if not present:
        raise ConfigException(f"none of {', '.join(map(str, files))} exists")
    for file in present:
        if not file.exists():
            raise ConfigException(f"{file} does not exist")
        try:
            read_yaml_mapping(file)
        except YamlFileError as exc:
            raise ConfigException(str(exc)) from None


async def load_configuration(kubeconfig: str | None = None) -> Configuration:
    """Connection settings: the in-cluster service account inside a pod, else a kubeconfig file
    (``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``). A file that is missing,
    unreadable or not YAML is refused with ``ConfigException`` naming it and the reason (the client
    library would say only that ``current-context`` is missing)."""
    configuration = Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return configuration
    files = kubeconfig_files(kubeconfig or os.environ.get("KUBECONFIG"))
    check_kubeconfig_files(files)
    await kube_config.load_kube_config(
        config_file=os.pathsep.join(map(str, files)),
        client_configuration=configuration,
        persist_config=False,
    )
    return configuration


class Kube:
    """Typed calls on one ``ApiClient``; create with ``from_configuration`` or from an existing client."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    @classmethod
    def from_configuration(cls, configuration: Configuration, *, user_agent: str = USER_AGENT) -> Kube:
        """A client for ``configuration`` whose session ignores proxy environment variables (see the
        module docstring). Call it inside the event loop that will use the client."""
        api = ApiClient(configuration=configuration)
        api.user_agent = user_agent
        rest = api.rest_client
        session: aiohttp.ClientSession = rest.pool_manager
        connector = session.connector
        rest.pool_manager = aiohttp.ClientSession(
            connector=connector, trust_env=False, read_bufsize=_READ_BUFSIZE
        )
        session.detach()  # the new session owns the connector now; the old one is closed without it
        return cls(api)

    @property
    def api(self) -> ApiClient:
        """The underlying client (shared by wrappers such as ``kubecache.CachedKube``)."""
        return self._api

    @property
    def configuration(self) -> Configuration:
        return self._api.configuration

    async def close(self) -> None:
        await self._api.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> Object:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            result = await self._api.call_api(
                path,
                method,
                query_params=list(query),
                header_params=headers,
                body=body,
                response_types_map=_OBJECT,
                auth_settings=_AUTH,
                _return_http_data_only=True,
            )
        except ApiException as exc:
            raise _error(exc) from None
        return result if isinstance(result, dict) else {}

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Object | None:
        """The object, or None when it does not exist."""
        try:
            return await self._call("GET", res.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list_with_version(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> tuple[list[Object], str]:
        """Like ``list``, plus the list's own ``metadata.resourceVersion`` ("" when the server sent none):
        a watch from that version sees every change made after the list was read."""
        query = [(k, v) for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v]
        result = await self._call("GET", res.path(namespace), query=query)
        items = result.get("items") or []
        for item in items:
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        version = str((result.get("metadata") or {}).get("resourceVersion") or "")
        return list(items), version

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> list[Object]:
        """Every matching object (across namespaces when ``namespace`` is None)."""
        items, _ = await self.list_with_version(res, namespace, labels=labels, fields=fields)
        return items

    async def list_view(self, res: Resource, namespace: str | None = None) -> Sequence[Mapping[str, Any]]:
        """Every object of ``res`` (in ``namespace``), to be read and not changed: a cache may hand out
        the objects it holds instead of copies. Here, a list from the API server."""
        return await self.list(res, namespace)

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Object:
        obj = {"apiVersion": res.api_version, "kind": res.kind, **body}
        return await self._call("POST", res.path(namespace), body=obj)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> Object:
        """A merge patch (a mapping) or a JSON patch (a list of operations); ``status`` targets /status."""
        content_type = MERGE_PATCH if isinstance(patch, Mapping) else JSON_PATCH
        path = res.path(namespace, name, "status" if status else "")
        return await self._call("PATCH", path, body=patch, content_type=content_type)

    async def replace(
        self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> Object:
        """PUT: fails with 409 when ``body.metadata.resourceVersion`` is stale."""
        return await self._call("PUT", res.path(namespace, name), body=dict(body))

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        grace_period: int | None = None,
    ) -> bool:
        """Delete (or start deleting, with finalizers); False when it was already gone.

        ``grace_period=0`` deletes a pod at once, as its kubelet does once the containers have stopped.
        """
        body: Object = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        try:
            await self._call("DELETE", res.path(namespace, name), body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def evict(self, name: str, namespace: str, *, grace_period: int | None = None) -> None:
        """Evict a pod through the eviction subresource (429 while a disruption budget forbids it)."""
        body: Object = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period}
        await self._call("POST", PODS.path(namespace, name, "eviction"), body=body)

    async def request_token(self, service_account: str, namespace: str, *, expiration_seconds: int) -> Object:
        """A token for ``service_account`` (TokenRequest, ``POST serviceaccounts/{name}/token``) with the
        API server's default audiences; the answer carries ``status.token`` and
        ``status.expirationTimestamp`` (the server may shorten the lifetime asked for)."""
        body: Object = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        }
        return await self._call("POST", SERVICE_ACCOUNTS.path(namespace, service_account, "token"), body=body)

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        resource_version: str = "",
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Object]]:
        """Events ``(ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, object)`` until the server ends the watch."""
        query = [("watch", "true"), ("timeoutSeconds", str(timeout_seconds)), ("allowWatchBookmarks", "true")]
        if labels:
            query.append(("labelSelector", labels))
        if resource_version:
            query.append(("resourceVersion", resource_version))
        try:
            response = await self._api.call_api(
                res.path(namespace),
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=_AUTH,
                _preload_content=False,
                _request_timeout=timeout_seconds + 30,
            )
        except ApiException as exc:
            raise _error(exc) from None
        try:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                yield str(event.get("type", "")), dict(event.get("object") or {})
        finally:
            response.release()

    async def event(
        self,
        obj: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        warning: bool = False,
        component: str = "nstance-operator",
    ) -> None:
        """Record a Kubernetes Event on ``obj`` (shown by ``kubectl describe``); never raises."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {
                "name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:12]}",
                "namespace": namespace,
            },
            # A cluster-scoped object has no namespace: its events live in "default" and name none.
            "involvedObject": {**ref_of(obj), **({"namespace": namespace} if meta.get("namespace") else {})}
            if meta.get("uid")
            else {},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.create(EVENTS, body, namespace)
        except KubeError as exc:
            log.debug("cannot record event %s on %s: %s", reason, meta.get("name"), exc)
