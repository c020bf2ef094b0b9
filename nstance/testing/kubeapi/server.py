"""The HTTP face of the Kubernetes API emulator: aiohttp routes, watch streams, and the server lifecycle.

``KubeAPIServer`` serves discovery, OpenAPI v3, CRUD, patches (server-side apply included), the
status/scale/eviction/finalize/token subresources, Table output and watches over plain HTTP on 127.0.0.1, with
JSON only (no protobuf, no authentication). It names each write's field manager (``fieldManager``, else the
User-Agent's product token) and runs validating admission webhooks between computing and storing a write.
Object semantics live in ``store.Store``; this module must not implement them itself, only translate HTTP
to store calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from nstance.testing.kubeapi import discovery, errors, openapi, scale, tables, tokens
from nstance.testing.kubeapi.admission import Admission, AdmissionRequest
from nstance.testing.kubeapi.manifests import load_manifests
from nstance.testing.kubeapi.metrics import RequestCounter, RequestKey, client_of, verb_of
from nstance.testing.kubeapi.resources import Registry, ResourceType
from nstance.testing.kubeapi.schema import unknown_fields
from nstance.testing.kubeapi.selectors import (
    FieldSelector,
    Selector,
    labels_of,
    matches_fields,
    matches_labels,
    parse_field_selector,
    parse_label_selector,
)
from nstance.testing.kubeapi.store import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Store,
    WatchEvent,
    patched_document,
)

JSON = dict[str, Any]
T = TypeVar("T")
log = logging.getLogger("nstance.testing.kubeapi")

# Kinds whose immediate delete answers with the deleted object (the real registries' ReturnDeletedObject);
# every other kind, custom resources included, answers with a Status naming it.
_RETURNS_DELETED_OBJECT = {("", "pods"), ("", "namespaces"), ("", "serviceaccounts"), ("", "services")}
_WRITE_RETRIES = 5
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


class _Target:
    """A parsed resource path."""

    def __init__(self, rtype: ResourceType, namespace: str | None, name: str | None, sub: str | None) -> None:
        self.rtype = rtype
        self.namespace = namespace
        self.name = name
        self.sub = sub


class KubeAPIServer:
    """An in-memory Kubernetes API server on 127.0.0.1 for tests; see the package docstring for usage."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        crds: Iterable[str | Path] = (),
        bookmark_interval: float = 1.0,
        history_limit: int = 10_000,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.host = host
        self.bookmark_interval = bookmark_interval
        self.registry = Registry()
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self.store = Store(self.registry, clock=self.clock, history_limit=history_limit)
        self.store.eviction_blocker = self._eviction_blocker
        self.admission = Admission()
        self.requests: list[tuple[str, str]] = []  # (method, path_qs) of every request, for debugging tests
        self.request_counts = RequestCounter()
        """Resource requests by verb, resource and client; served at ``/metrics``."""
        self._crd_paths = [Path(p) for p in crds]
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch_queues: set[asyncio.Queue[WatchEvent | None]] = set()
        self._evictions_to_fail = 0
        self._eviction_predicate: Callable[[JSON], bool] | None = None

    # ----------------------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("KubeAPIServer is not started: call await server.start() first")
        return f"http://{self.host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self, port: int = 0) -> KubeAPIServer:
        """Bind ``host:port`` (0 = a free port) and serve; CRD files given to the constructor are loaded."""
        if self._runner is not None:
            raise RuntimeError("KubeAPIServer is already started")
        self._loop = asyncio.get_running_loop()
        if self._crd_paths:
            self.load_crd_files(self._crd_paths)
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=2.0, access_log=None, handler_cancellation=True
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, port)
        await site.start()
        self._runner = runner
        address = runner.addresses[0]
        self._port = int(address[1])
        log.info("Kubernetes API emulator listening on %s", self.url)
        return self

    async def stop(self) -> None:
        """Close every watch stream, then stop listening. Safe to call twice."""
        for queue in list(self._watch_queues):
            queue.put_nowait(None)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self.admission.close()

    async def __aenter__(self) -> KubeAPIServer:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @classmethod
    @contextlib.contextmanager
    def in_thread(cls, *, port: int = 0, **kwargs: Any) -> Iterator[KubeAPIServer]:
        """Run a server on its own event loop in a daemon thread (for sync tests); stops on exit."""
        server = cls(**kwargs)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="kubeapi-emulator", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(server.start(port), loop).result(timeout=30)
            yield server
        finally:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
            loop.close()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (thread-safe); direct when already there or not started."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return fn()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return fn()

        async def wrapper() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), loop).result(timeout=30)

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig (context ``emulator``, no auth) pointing at this server; returns the path."""
        target = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
            "preferences": {},
        }
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(config, indent=2) + "\n")
        return target

    # ----------------------------------------------------------------------------- loading objects

    def load_crd_files(self, paths: Iterable[str | Path]) -> list[JSON]:
        """Create or update every object (CRDs first) in YAML/JSON files or directories; thread-safe."""
        documents = load_manifests(paths)
        return self.call(lambda: self.apply_objects(documents))

    async def apply_crd_files(self, paths: Iterable[str | Path]) -> list[JSON]:
        """Async form of ``load_crd_files`` (call it on the server's loop)."""
        return self.load_crd_files(paths)

    def apply_objects(self, documents: Iterable[JSON]) -> list[JSON]:
        """Create each object, or replace it if it exists (no admission); CRDs are applied first."""
        docs = sorted(documents, key=lambda d: 0 if d.get("kind") == "CustomResourceDefinition" else 1)
        results = []
        for doc in docs:
            rtype = self._type_for(doc)
            meta = doc.get("metadata") or {}
            namespace = (meta.get("namespace") or "default") if rtype.namespaced else None
            existing = self.store.find(rtype, namespace, str(meta.get("name", "")))
            if existing is None:
                results.append(self.store.create(rtype, namespace, doc))
            else:
                body = copy.deepcopy(doc)
                body.setdefault("metadata", {})["resourceVersion"] = existing["metadata"]["resourceVersion"]
                results.append(self.store.update(rtype, namespace, existing["metadata"]["name"], body))
        return results

    def _type_for(self, doc: Any) -> ResourceType:
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
            raise ValueError(f"a manifest needs apiVersion and kind: {str(doc)[:200]}")
        api_version = str(doc["apiVersion"])
        group, _, version = api_version.rpartition("/")
        for rtype in self.registry.types():
            if rtype.group == group and rtype.version == version and rtype.kind == doc["kind"]:
                return rtype
        raise ValueError(
            f"the emulator does not serve kind {doc['kind']} in {api_version}; load its CRD first"
        )

    # ----------------------------------------------------------------------------- test hooks

    def fail_evictions(self, times: int) -> None:
        """Make the next ``times`` pod evictions answer 429 TooManyRequests (like a disruption budget)."""
        self.call(lambda: setattr(self, "_evictions_to_fail", max(0, times)))

    def block_evictions(self, predicate: Callable[[JSON], bool] | None) -> None:
        """Answer 429 for every eviction whose pod matches ``predicate`` (``None`` removes the block)."""
        self.call(lambda: setattr(self, "_eviction_predicate", predicate))

    def _eviction_blocker(self, pod: JSON) -> str | None:
        if self._evictions_to_fail > 0:
            self._evictions_to_fail -= 1
            return "The disruption budget emulator-test-hook needs more healthy pods (test hook)"
        if self._eviction_predicate is not None and self._eviction_predicate(pod):
            return "The disruption budget emulator-test-hook blocks this pod (test hook)"
        return None

    # ----------------------------------------------------------------------------- HTTP plumbing

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        if len(self.requests) > 10_000:
            del self.requests[:5_000]
        log.debug("%s %s", request.method, request.path_qs)
        try:
            return await handler(request)
        except errors.APIError as exc:
            log.debug("%s %s -> %s", request.method, request.path_qs, exc)
            return _json_response(exc.status(), exc.code, exc.headers or None)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # a bug in the emulator: answer like the real server's 500, keep serving
            log.exception("emulator error on %s %s", request.method, request.path_qs)
            error = errors.internal(f"{type(exc).__name__}: {exc}")
            return _json_response(error.status(), 500)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        protobuf_only = "protobuf" in accept and "json" not in accept and "*/*" not in accept
        if protobuf_only and not request.path.startswith("/openapi"):
            raise errors.APIError(406, "NotAcceptable", "only application/json is supported by the emulator")
        parts = [p for p in request.path.split("/") if p]
        discovery_path = (
            parts in (["version"], ["healthz"], ["readyz"], ["livez"], ["api"], ["apis"])
            or (parts[:1] == ["apis"] and len(parts) in (2, 3))
            or (parts[:1] == ["api"] and len(parts) == 2)
        )
        if discovery_path and request.method != "GET":
            raise errors.method_not_allowed()
        if parts[:2] == ["openapi", "v3"]:
            # OpenAPI v3 only: kubectl finds fieldValidation on every kind there and leaves validation
            # to the server; ``kubectl explain`` reads the schemas. No v2 document is served.
            if len(parts) == 2:
                return _json_response(openapi.index(self.registry))
            served = None
            if parts[2:3] == ["api"] and len(parts) == 4:
                served = openapi.document(self.registry, "", parts[3])
            elif parts[2:3] == ["apis"] and len(parts) == 5:
                served = openapi.document(self.registry, parts[3], parts[4])
            if served is None:
                raise _not_found_path()
            return _json_response(served)
        if parts[:1] == ["openapi"]:
            raise _not_found_path()
        if parts == ["version"]:
            return _json_response(discovery.version())
        if parts == ["metrics"] and request.method == "GET":
            return web.Response(text=self.request_counts.render(), content_type="text/plain")
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return web.Response(text="ok")
        if parts == ["api"]:
            return _json_response(discovery.core_versions(f"{self.host}:{self._port}"))
        if parts == ["apis"]:
            return _json_response(discovery.group_list(self.registry))
        if parts[:1] == ["apis"] and len(parts) == 2:
            doc = discovery.group(self.registry, parts[1])
            if doc is None:
                raise _not_found_path()
            return _json_response(doc)
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _not_found_path()
        if not rest:
            doc = discovery.resource_list(self.registry, group, version)
            if doc is None:
                raise _not_found_path()
            return _json_response(doc)
        watch_path = rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        target = self._parse_target(group, version, rest)
        return await self._resource(request, target, watch_path)

    def _parse_target(self, group: str, version: str, rest: list[str]) -> _Target:
        namespace: str | None = None
        core_ns_sub = (
            group == "" and len(rest) == 3 and rest[0] == "namespaces" and rest[2] in ("status", "finalize")
        )
        if len(rest) >= 3 and rest[0] == "namespaces" and not core_ns_sub:
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise _not_found_path()
        rtype = self.registry.lookup(group, version, rest[0])
        if rtype is None:
            raise _not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not rtype.namespaced:
            raise _not_found_path()
        if rtype.namespaced and name is not None and namespace is None:
            raise _not_found_path()
        if sub is not None and sub not in rtype.subresources:
            raise _not_found_path()
        return _Target(rtype, namespace, name, sub)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if "protobuf" in content_type:
            raise errors.unsupported_media_type(content_type, ["application/json", "application/yaml"])
        if content_type in ("application/yaml", "application/x-yaml", APPLY_PATCH):
            import yaml

            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise errors.bad_request(f"the request body is not valid YAML: {exc}") from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"the request body is not valid JSON: {exc}") from None

    async def _resource(self, request: web.Request, target: _Target, watch_path: bool) -> web.StreamResponse:
        method = request.method
        query = request.query
        rtype = target.rtype
        dry_run = bool(query.get("dryRun"))
        watch = watch_path or _truthy(query.get("watch"))
        self.request_counts.record(
            RequestKey(
                verb_of(method, named=target.name is not None, watch=watch),
                rtype.group,
                rtype.plural,
                target.sub or "",
                client_of(request.headers.get("User-Agent", "")),
            )
        )
        manager = _field_manager(request)
        if method == "GET":
            if target.name is None:
                labels = parse_label_selector(query.get("labelSelector"))
                fields = parse_field_selector(query.get("fieldSelector"), rtype.fields, rtype.custom)
                if watch_path or _truthy(query.get("watch")):
                    return await self._watch(request, target, labels, fields)
                limit = _int_param(query, "limit")
                listed = self.store.list_objects(
                    rtype,
                    target.namespace,
                    labels,
                    fields,
                    limit=limit,
                    continue_token=query.get("continue", ""),
                )
                if tables.wants_table(request.headers.get("Accept", "")):
                    include = tables.include_object(query)
                    return _json_response(
                        tables.table(rtype, listed["items"], include=include, metadata=listed.get("metadata"))
                    )
                return _json_response(listed)
            if watch_path:
                fields = parse_field_selector(f"metadata.name={target.name}", rtype.fields, rtype.custom)
                return await self._watch(request, target, (), fields)
            obj = self.store.get(rtype, target.namespace, target.name)
            if target.sub == "scale":
                return _json_response(scale.view(rtype, obj))
            if tables.wants_table(request.headers.get("Accept", "")):
                meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
                return _json_response(
                    tables.table(rtype, [obj], include=tables.include_object(query), metadata=meta)
                )
            return _json_response(obj)
        if method == "POST":
            body = await self._body(request)
            if target.name is None:
                warnings = _field_validation(query, target, body, "")
                return _warn(await self._create(target, body, dry_run, manager), warnings)
            if target.sub == "eviction":
                return await self._evict(target, body)
            if target.sub == "token":
                return await self._token(target, body)
            if target.sub is None and isinstance(body, dict):
                # Like the real server: a POST to an object's own path is a create of that name.
                meta = body.setdefault("metadata", {})
                if meta.get("name", target.name) != target.name:
                    raise errors.bad_request(
                        f"the name of the object ({meta['name']}) does not match the name on the URL "
                        f"({target.name})"
                    )
                meta["name"] = target.name
                return await self._create(
                    _Target(rtype, target.namespace, None, None), body, dry_run, manager
                )
            raise errors.method_not_allowed()
        if target.name is None:
            if method == "DELETE":
                labels = parse_label_selector(query.get("labelSelector"))
                fields = parse_field_selector(query.get("fieldSelector"), rtype.fields, rtype.custom)
                options = await self._body(request) or {}
                propagation = query.get("propagationPolicy") or (
                    options.get("propagationPolicy") if isinstance(options, dict) else None
                )
                return _json_response(
                    self.store.delete_collection(
                        rtype, target.namespace, labels, fields, propagation=propagation
                    )
                )
            raise errors.method_not_allowed()
        if method == "PUT":
            body = await self._body(request)
            if target.sub == "finalize":
                return _json_response(self.store.finalize_namespace(target.name, body))
            if target.sub == "scale":
                return await self._scale(target, dry_run, lambda _current: body, manager)
            if target.sub not in (None, "status"):
                raise errors.method_not_allowed()
            warnings = _field_validation(query, target, body, "")
            response = await self._update(
                target,
                dry_run,
                lambda: self.store.prepare_update(
                    rtype, target.namespace, str(target.name), body, target.sub, manager
                ),
            )
            return _warn(response, warnings)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            if target.sub == "scale":
                if content_type == APPLY_PATCH:  # a documented limit of the emulator
                    raise errors.unsupported_media_type(
                        content_type, [JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH]
                    )
                patch = await self._body(request)
                return await self._scale(
                    target,
                    dry_run,
                    lambda current: patched_document(current, content_type, patch, strategic=True),
                    manager,
                )
            if target.sub not in (None, "status"):
                raise errors.method_not_allowed()
            body = await self._body(request)
            warnings = _field_validation(query, target, body, content_type)
            if content_type == APPLY_PATCH:
                return _warn(await self._apply(request, target, body, dry_run), warnings)
            if "force" in query:
                raise errors.unprocessable("force: Forbidden: may not be specified for non-apply patch")
            response = await self._update(
                target,
                dry_run,
                lambda: self.store.prepare_patch(
                    rtype, target.namespace, str(target.name), content_type, body, target.sub, manager
                ),
            )
            return _warn(response, warnings)
        if method == "DELETE":
            if target.sub is not None:
                raise errors.method_not_allowed()
            return await self._delete(request, target, dry_run)
        raise errors.method_not_allowed()

    # ----------------------------------------------------------------------------- writes

    def _webhook_configs(self) -> list[JSON]:
        rtype = self.registry.lookup("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
        return self.store.list_objects(rtype, None)["items"] if rtype is not None else []

    def _namespace_labels(self, namespace: str | None) -> dict[str, str] | None:
        if not namespace:
            return None
        ns_type = self.registry.require("", "v1", "namespaces")
        found = self.store.find(ns_type, None, namespace)
        return labels_of(found) if found else {}

    async def _admit(
        self, operation: str, target: _Target, obj: JSON | None, old: JSON | None, dry_run: bool
    ) -> None:
        if target.rtype.group == "admissionregistration.k8s.io":
            return  # like the real server: webhook configurations are never sent to webhooks
        configs = self._webhook_configs()
        if not any(c.get("webhooks") for c in configs):
            return
        meta = (obj or old or {}).get("metadata") or {}
        namespace = meta.get("namespace") or target.namespace
        request = AdmissionRequest(
            operation=operation,
            rtype=target.rtype,
            subresource=target.sub,
            namespace=namespace,
            name=str(meta.get("name") or target.name or ""),
            obj=obj,
            old=old,
            dry_run=dry_run,
        )
        await self.admission.validate(configs, request, self._namespace_labels(namespace))

    async def _create(
        self, target: _Target, body: Any, dry_run: bool, manager: str | None
    ) -> web.StreamResponse:
        rtype = target.rtype
        for attempt in range(_WRITE_RETRIES):
            candidate = self.store.prepare_create(rtype, target.namespace, body, manager)
            await self._admit("CREATE", target, candidate, None, dry_run)
            if dry_run:
                return _json_response(candidate, 201)
            try:
                return _json_response(self.store.commit_create(rtype, candidate), 201)
            except errors.APIError as exc:
                if (
                    exc.code != 409
                    or attempt == _WRITE_RETRIES - 1
                    or (body or {}).get("metadata", {}).get("name")
                ):
                    raise
        raise errors.internal("create kept conflicting")  # pragma: no cover - loop always returns or raises

    async def _apply(
        self, request: web.Request, target: _Target, body: Any, dry_run: bool
    ) -> web.StreamResponse:
        """Server-side apply: create the object if it is missing, else merge it for the field manager."""
        manager = request.query.get("fieldManager", "")
        if not manager:
            raise errors.unprocessable(
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                "is required for apply patch"
            )
        force = request.query.get("force")
        if force is not None and force not in ("true", "false"):
            raise errors.bad_request(f"force: Invalid value: {force!r}: must be true or false")
        name = str(target.name)
        for attempt in range(_WRITE_RETRIES):
            old, new = self.store.prepare_apply(
                target.rtype,
                target.namespace,
                name,
                body,
                manager,
                force=force == "true",
                subresource=target.sub,
            )
            if old is None:
                await self._admit("CREATE", target, new, None, dry_run)
                if dry_run:
                    return _json_response(new, 201)
                try:
                    return _json_response(self.store.commit_create(target.rtype, new), 201)
                except errors.APIError as exc:
                    if exc.reason != "AlreadyExists" or attempt == _WRITE_RETRIES - 1:
                        raise
                    continue
            await self._admit("UPDATE", target, new, old, dry_run)
            if dry_run:
                return _json_response(new)
            try:
                return _json_response(self.store.commit_update(target.rtype, old, new))
            except errors.APIError as exc:
                if exc.reason != "Conflict" or attempt == _WRITE_RETRIES - 1:
                    raise
        raise errors.internal("apply kept conflicting")  # pragma: no cover

    async def _scale(
        self, target: _Target, dry_run: bool, change: Callable[[JSON], Any], manager: str
    ) -> web.StreamResponse:
        """A write of the scale subresource; answers with the object's new ``Scale``."""
        rtype = target.rtype
        return await self._update(
            target,
            dry_run,
            lambda: self.store.prepare_scale(rtype, target.namespace, str(target.name), change, manager),
            view=lambda obj: scale.view(rtype, obj),
        )

    async def _update(
        self,
        target: _Target,
        dry_run: bool,
        prepare: Callable[[], tuple[JSON, JSON]],
        view: Callable[[JSON], JSON] = lambda obj: obj,
    ) -> web.StreamResponse:
        rtype = target.rtype
        for attempt in range(_WRITE_RETRIES):
            old, new = prepare()
            await self._admit("UPDATE", target, new, old, dry_run)
            if dry_run:
                return _json_response(view(new))
            try:
                return _json_response(view(self.store.commit_update(rtype, old, new)))
            except errors.APIError as exc:
                # prepare() re-checks the client's own preconditions, so retrying is always safe.
                if exc.reason != "Conflict" or attempt == _WRITE_RETRIES - 1:
                    raise
        raise errors.internal("update kept conflicting")  # pragma: no cover

    async def _delete(self, request: web.Request, target: _Target, dry_run: bool) -> web.StreamResponse:
        rtype = target.rtype
        name = str(target.name)
        options = await self._body(request) or {}
        if not isinstance(options, dict):
            raise errors.bad_request("DeleteOptions must be a JSON object")
        propagation = request.query.get("propagationPolicy") or options.get("propagationPolicy")
        if options.get("orphanDependents") is True and not propagation:
            propagation = "Orphan"
        preconditions = options.get("preconditions")
        old = self.store.prepare_delete(rtype, target.namespace, name, preconditions)
        await self._admit("DELETE", target, None, old, dry_run)
        if dry_run:
            return _json_response(old)
        result = self.store.delete(
            rtype, target.namespace, name, propagation=propagation, preconditions=preconditions
        )
        still_there = self.store.find(rtype, target.namespace, name)
        if still_there is not None and still_there["metadata"]["uid"] == result["metadata"]["uid"]:
            # Like the real server: 202 only when the client explicitly asked orphanDependents=false.
            return _json_response(result, 202 if options.get("orphanDependents") is False else 200)
        if rtype.key not in _RETURNS_DELETED_OBJECT:
            details = {"name": name, "kind": rtype.plural, "uid": result["metadata"]["uid"]}
            if rtype.group:
                details["group"] = rtype.group
            return _json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }
            )
        return _json_response(result)

    async def _evict(self, target: _Target, body: Any) -> web.StreamResponse:
        """``POST pods/{name}/eviction``: webhooks on ``pods/eviction`` CREATE run, then the store decides."""
        namespace, name = str(target.namespace), str(target.name)
        self.store.prepare_delete(target.rtype, namespace, name)  # 404 before calling any webhook
        await self._admit("CREATE", target, body if isinstance(body, dict) else None, None, False)
        self.store.evict(namespace, name, body)
        return _json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
        )

    async def _token(self, target: _Target, body: Any) -> web.StreamResponse:
        """``POST serviceaccounts/{name}/token``: a TokenRequest answered by ``tokens`` (webhooks on
        ``serviceaccounts/token`` CREATE run after the checks, as on a real server)."""
        namespace, name = str(target.namespace), str(target.name)
        request = tokens.check_request(body, namespace, name)
        account = self.store.get(target.rtype, namespace, name)
        request = tokens.validated(request, account)
        await self._admit("CREATE", target, request, None, False)
        return _json_response(tokens.issue(request, account, self.clock()), 201)

    # ----------------------------------------------------------------------------- watch

    async def _watch(
        self, request: web.Request, target: _Target, labels: Selector, fields: FieldSelector
    ) -> web.StreamResponse:
        rtype = target.rtype
        query = request.query
        rv_text = query.get("resourceVersion", "")
        send_initial = _truthy(query.get("sendInitialEvents"))
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        timeout_seconds = _int_param(query, "timeoutSeconds")
        if rv_text not in ("", "0") and not rv_text.isdigit():
            raise errors.bad_request(f"resourceVersion: Invalid value: {rv_text!r}: must be an integer")

        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        encode: Callable[[JSON], bytes] = _line
        if tables.wants_table(request.headers.get("Accept", "")):
            encode = self._table_encoder(rtype, tables.include_object(query))

        def listener(event: WatchEvent) -> None:
            if event.key == rtype.key:
                queue.put_nowait(event)

        unsubscribe = self.store.subscribe(listener)
        self._watch_queues.add(queue)
        try:
            pending: list[JSON] = []
            if rv_text in ("", "0") or send_initial:
                for obj in self.store.matching(rtype, target.namespace, labels, fields):
                    pending.append({"type": "ADDED", "object": self._as_version(rtype, obj)})
                if send_initial and bookmarks:
                    pending.append(self._bookmark(rtype, initial_end=True))
            else:
                try:
                    history = self.store.events_since(int(rv_text))
                except errors.APIError as exc:
                    pending.append({"type": "ERROR", "object": exc.status()})
                    history = []
                    unsubscribe()
                    queue.put_nowait(None)
                for event in history:
                    if event.key != rtype.key:
                        continue
                    translated = self._translate(event, target, labels, fields)
                    if translated is not None:
                        pending.append(translated)
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            for item in pending:
                await response.write(encode(item))
            await self._stream(response, queue, target, labels, fields, bookmarks, timeout_seconds, encode)
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await response.write_eof()
            return response
        finally:
            unsubscribe()
            self._watch_queues.discard(queue)

    async def _stream(
        self,
        response: web.StreamResponse,
        queue: asyncio.Queue[WatchEvent | None],
        target: _Target,
        labels: Selector,
        fields: FieldSelector,
        bookmarks: bool,
        timeout_seconds: int,
        encode: Callable[[JSON], bytes],
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds if timeout_seconds > 0 else None
        next_bookmark = loop.time() + self.bookmark_interval
        while True:
            now = loop.time()
            waits = [next_bookmark - now] if bookmarks else []
            if deadline is not None:
                waits.append(deadline - now)
            wait = max(0.0, min(waits)) if waits else None
            try:
                event = await asyncio.wait_for(queue.get(), wait) if wait is not None else await queue.get()
            except TimeoutError:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return
                await response.write(encode(self._bookmark(target.rtype)))
                next_bookmark = now + self.bookmark_interval
                continue
            if event is None:
                return
            translated = self._translate(event, target, labels, fields)
            if translated is not None:
                await response.write(encode(translated))

    @staticmethod
    def _table_encoder(rtype: ResourceType, include: str) -> Callable[[JSON], bytes]:
        """Watch events with their object as a one-row Table; only the first carries the columns."""
        first = [True]

        def encode(item: JSON) -> bytes:
            if item["type"] in ("BOOKMARK", "ERROR"):
                return _line(item)
            obj = item["object"]
            rendered = tables.table(
                rtype,
                [obj],
                include=include,
                metadata={"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                with_columns=first[0],
            )
            first[0] = False
            return _line({"type": item["type"], "object": rendered})

        return encode

    def _as_version(self, rtype: ResourceType, obj: JSON) -> JSON:
        view = dict(obj)
        view["apiVersion"] = rtype.api_version
        view["kind"] = rtype.kind
        return view

    def _bookmark(self, rtype: ResourceType, initial_end: bool = False) -> JSON:
        meta: JSON = {"resourceVersion": str(self.store.resource_version)}
        if initial_end:
            meta["annotations"] = {_INITIAL_EVENTS_END: "true"}
        return {
            "type": "BOOKMARK",
            "object": {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta},
        }

    def _translate(
        self, event: WatchEvent, target: _Target, labels: Selector, fields: FieldSelector
    ) -> JSON | None:
        """The event as this watcher sees it (objects entering/leaving its selection become ADDED/DELETED)."""
        rtype = target.rtype

        def selected(obj: JSON | None) -> bool:
            if obj is None:
                return False
            if target.namespace and rtype.namespaced and obj["metadata"].get("namespace") != target.namespace:
                return False
            return matches_labels(labels, obj) and matches_fields(fields, obj)

        now_in = selected(event.obj)
        if event.type == "MODIFIED":
            was_in = selected(event.old)
            if now_in and not was_in:
                kind = "ADDED"
            elif was_in and not now_in:
                kind = "DELETED"
            elif now_in:
                kind = "MODIFIED"
            else:
                return None
        elif now_in:
            kind = event.type
        else:
            return None
        return {"type": kind, "object": self._as_version(rtype, event.obj)}


FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


def _field_manager(request: web.Request) -> str:
    """The write's field manager: ``fieldManager``, else the User-Agent up to its first ``/`` (like the
    real server), at most 128 characters."""
    explicit = request.query.get("fieldManager")
    if explicit:
        return explicit[:128]
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0][:128] or "unknown"


def _field_validation(query: Any, target: _Target, body: Any, content_type: str) -> list[str]:
    """Unknown fields of a write: a 400 under ``fieldValidation=Strict``, warnings under ``Warn`` (the
    default), nothing under ``Ignore``. Only custom resources have a schema to check against here."""
    directive = query.get("fieldValidation") or "Warn"
    if directive not in FIELD_VALIDATION:
        raise errors.bad_request(
            f'fieldValidation: Unsupported value: "{directive}": supported values: "Ignore", "Strict", "Warn"'
        )
    rtype = target.rtype
    if directive == "Ignore" or not rtype.custom or content_type == JSON_PATCH:
        return []
    unknown = unknown_fields(body, rtype.schema)
    if unknown and directive == "Strict":
        listed = ", ".join(f'unknown field "{path}"' for path in unknown)
        raise errors.bad_request(
            f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
            f"strict decoding error: {listed}"
        )
    return [f'unknown field "{path}"' for path in unknown]


def _warn(response: web.StreamResponse, warnings: list[str]) -> web.StreamResponse:
    for text in warnings:
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        response.headers.add("Warning", f'299 - "{escaped}"')
    return response


def _truthy(value: str | None) -> bool:
    """Go's strconv.ParseBool true values, as the real server accepts them in query parameters."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _line(item: JSON) -> bytes:
    return json.dumps(item, separators=(",", ":")).encode() + b"\n"


def _int_param(query: Any, name: str) -> int:
    text = query.get(name, "")
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        raise errors.bad_request(f"{name}: Invalid value: {text!r}: must be an integer") from None


def _not_found_path() -> web.HTTPNotFound:
    """A path no resource is served at: the real server's plain-text 404 (not a Status object)."""
    return web.HTTPNotFound(
        text="404 page not found\n", content_type="text/plain", headers={"X-Content-Type-Options": "nosniff"}
    )
