"""The emulator's object store: Kubernetes object semantics on in-memory dicts, with a watch history.

Responsible for: metadata the server owns (uid, creationTimestamp, generation, a global integer
resourceVersion), generateName, optimistic concurrency, status-subresource separation, CRD schema
defaulting/pruning/validation, finalizers and graceful deletion, namespace termination, owner-reference
garbage collection (Background, Foreground, Orphan), CRD registration, evictions with
PodDisruptionBudgets, and a bounded history of watch events that listeners are told about synchronously.

Every write is split into ``prepare_*`` (compute and validate the new object, raising ``APIError``) and
``commit_*`` (store it if nothing changed meanwhile), so the HTTP layer can run admission webhooks in
between. This module is pure and synchronous: it must not do I/O, sleep or know about HTTP or asyncio.

Simplifications (documented, on purpose): pods are deleted at once (there is no kubelet and no grace
period); garbage collection runs synchronously inside the delete that triggers it, only for the
dependents of objects deleted here (an object created with a dangling owner reference is not collected);
``blockOwnerDeletion`` is ignored (every dependent holds a Foreground deletion); a PodDisruptionBudget
counts the matching pods that exist now as its expected pods (there are no workload controllers) and a pod
is healthy when its ``Ready`` condition is True; deleting a CRD deletes its objects (honouring their
finalizers) before the CRD goes, like the real server; objects are stored once per group/resource and
served in every version of it without conversion (only ``apiVersion`` changes); core ``v1`` and
``events.k8s.io/v1`` events are separate collections.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import random
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nstance.testing.kubeapi import bodytype, builtinrules, errors, fieldmanager, patches, scale, schema
from nstance.testing.kubeapi.resources import Registry, ResourceType, validate_crd
from nstance.testing.kubeapi.selectors import (
    FieldSelector,
    Selector,
    matches_fields,
    matches_labels,
    selector_from_object,
)

JSON = dict[str, Any]
Key = tuple[str, str]
log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

NAMESPACES: Key = ("", "namespaces")
PODS: Key = ("", "pods")
CRDS: Key = ("apiextensions.k8s.io", "customresourcedefinitions")
PDBS: Key = ("policy", "poddisruptionbudgets")
WEBHOOK_CONFIGS: Key = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"
NAMESPACE_FINALIZER = "kubernetes"
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kinds whose create keeps the status the client sent (everything else with a status subresource drops it).
_KEEP_STATUS_ON_CREATE = {("", "nodes")}


@dataclass(frozen=True)
class WatchEvent:
    """One change: ``type`` is ADDED, MODIFIED or DELETED; ``old`` is the previous state for MODIFIED."""

    rv: int
    key: Key
    type: str
    obj: JSON
    old: JSON | None = None


def utc_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


def _rv(obj: JSON) -> int:
    return int(obj["metadata"]["resourceVersion"])


def _strip(obj: JSON, *, status: bool) -> JSON:
    """Everything except metadata (and status when it is a subresource): what changes ``generation``."""
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if status else set())
    return {k: v for k, v in obj.items() if k not in skip}


def _same_content(old: JSON, new: JSON) -> bool:
    """True when a write would change nothing (a no-op update keeps the resourceVersion, like etcd3)."""

    def norm(obj: JSON) -> JSON:
        clean = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        clean["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
        return clean

    return norm(old) == norm(new)


class Store:
    """In-memory objects of every served resource; see the module docstring for the semantics."""

    def __init__(
        self,
        registry: Registry | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
        history_limit: int = 10_000,
        namespaces: Iterable[str] = ("default", "kube-system", "kube-public", "kube-node-lease"),
    ) -> None:
        self.registry = registry or Registry()
        self._clock = clock or (lambda: datetime.now(UTC))
        self._objects: dict[Key, dict[tuple[str, str], JSON]] = {}
        self._uids: dict[str, tuple[Key, str, str]] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque(maxlen=max(1, history_limit))
        self._floor = 0  # every event with rv > floor is still in the history
        self._listeners: list[Callable[[WatchEvent], None]] = []
        self._foreground: set[str] = set()
        self._terminating_ns: set[str] = set()
        self._terminating_crds: set[str] = set()
        self.eviction_blocker: Callable[[JSON], str | None] | None = None
        ns_type = self.registry.lookup("", "v1", "namespaces")
        assert ns_type is not None
        for name in namespaces:
            self.create(ns_type, None, {"metadata": {"name": name}})

    # ----------------------------------------------------------------------------- reading

    @property
    def resource_version(self) -> int:
        return self._rv

    def now(self) -> str:
        return utc_timestamp(self._clock())

    def _bucket(self, key: Key) -> dict[tuple[str, str], JSON]:
        return self._objects.setdefault(key, {})

    def _view(self, rtype: ResourceType, obj: JSON) -> JSON:
        view = copy.deepcopy(obj)
        view["apiVersion"] = rtype.api_version
        view["kind"] = rtype.kind
        return view

    @staticmethod
    def _read_view(rtype: ResourceType, obj: JSON) -> JSON:
        """``_view`` without the copy: shares everything below the top level with the stored object, so
        it is for reading only (a patch's base, which ``patched_document`` copies before changing)."""
        view = dict(obj)
        view["apiVersion"] = rtype.api_version
        view["kind"] = rtype.kind
        return view

    def _ns(self, rtype: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rtype.namespaced else ""

    def _stored(self, rtype: ResourceType, namespace: str | None, name: str) -> JSON:
        found = self._bucket(rtype.key).get((self._ns(rtype, namespace), name))
        if found is None:
            raise errors.not_found(rtype.group, rtype.plural, name)
        return found

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> JSON:
        return self._view(rtype, self._stored(rtype, namespace, name))

    def find(self, rtype: ResourceType, namespace: str | None, name: str) -> JSON | None:
        found = self._bucket(rtype.key).get((self._ns(rtype, namespace), name))
        return None if found is None else self._view(rtype, found)

    def find_by_uid(self, uid: str) -> JSON | None:
        where = self._uids.get(uid)
        if where is None:
            return None
        key, ns, name = where
        obj = self._bucket(key).get((ns, name))
        return copy.deepcopy(obj) if obj is not None else None

    def matching(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: Selector = (),
        fields: FieldSelector = (),
    ) -> list[JSON]:
        """Stored objects (not copies) in key order, filtered by namespace and selectors."""
        bucket = self._bucket(rtype.key)
        found = []
        for (ns, _name), obj in sorted(bucket.items()):
            if namespace and rtype.namespaced and ns != namespace:
                continue
            if matches_labels(labels, obj) and matches_fields(fields, obj):
                found.append(obj)
        return found

    def list_objects(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: Selector = (),
        fields: FieldSelector = (),
        *,
        limit: int = 0,
        continue_token: str = "",
    ) -> JSON:
        """A ``{Kind}List`` body; ``limit``/``continue`` paginate in key order."""
        items = self.matching(rtype, namespace, labels, fields)
        list_rv = self._rv
        if continue_token:
            list_rv, start = _decode_continue(continue_token)
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > start]
        meta: JSON = {"resourceVersion": str(list_rv)}
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = _encode_continue(list_rv, (last.get("namespace", ""), last["name"]))
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "kind": rtype.list_kind,
            "apiVersion": rtype.api_version,
            "metadata": meta,
            "items": [self._view(rtype, o) for o in items],
        }

    # ----------------------------------------------------------------------------- watching

    def subscribe(self, listener: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Call ``listener`` synchronously for every future event; returns the unsubscribe function."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def events_since(self, rv: int) -> list[WatchEvent]:
        """Events after ``rv`` from the history; raises 410 Expired when ``rv`` is older than it."""
        if rv < self._floor:
            raise errors.gone(f"too old resource version: {rv} ({self._floor + 1})")
        return [event for event in self._history if event.rv > rv]

    def _emit(self, event_type: str, key: Key, obj: JSON, old: JSON | None = None) -> None:
        # No copies: a stored object is never changed in place (every change stores a new object and
        # the old one is only dropped), so the event may hold the stored versions themselves.
        event = WatchEvent(_rv(obj), key, event_type, obj, old)
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken watcher must never break a write
                log.exception("watch listener failed for %s %s", event_type, key)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # ----------------------------------------------------------------------------- create

    def prepare_create(
        self, rtype: ResourceType, namespace: str | None, body: Any, manager: str | None = None
    ) -> JSON:
        """Validate and complete a new object (uid, timestamps, generation); not stored yet.

        ``manager`` (the request's field manager) is recorded in ``managedFields`` as owning every field.
        """
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of a {rtype.kind} create must be a JSON object")
        bodytype.check_written(rtype, body)
        obj = copy.deepcopy(body)
        meta = _meta(obj)
        if rtype.namespaced:
            body_ns = meta.get("namespace")
            if namespace is None:
                namespace = body_ns or None
            if body_ns and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if not namespace:
                raise errors.bad_request(f"a namespace is required to create {rtype.plural}")
            meta["namespace"] = namespace
            self._check_namespace_open(namespace, rtype)
        else:
            meta.pop("namespace", None)
        if rtype.custom:
            crd_name = self.registry.crd_name_for(rtype.key)
            if crd_name in self._terminating_crds:
                raise errors.method_not_allowed(
                    "create not allowed while custom resource definition is terminating"
                )
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid_object(
                    rtype.group,
                    rtype.kind,
                    "",
                    [
                        errors.FieldError(
                            "metadata.name",
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            meta["name"] = str(prefix) + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        name = meta["name"]
        self._check_name(rtype, name)
        if (self._ns(rtype, namespace), name) in self._bucket(rtype.key):
            raise errors.already_exists(rtype.group, rtype.plural, name)
        for field_name in (
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            meta.pop(field_name, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.now()
        meta["generation"] = 1
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        if rtype.has_status and rtype.key not in _KEEP_STATUS_ON_CREATE:
            obj.pop("status", None)
        self._defaults_on_create(rtype, obj)
        obj = self._validate(rtype, obj, None)
        if manager:
            obj["metadata"]["managedFields"] = self._record(rtype, None, obj, manager, None)
        return obj

    def commit_create(self, rtype: ResourceType, obj: JSON) -> JSON:
        meta = obj["metadata"]
        bucket = self._bucket(rtype.key)
        slot = (meta.get("namespace", ""), meta["name"])
        if slot in bucket:
            raise errors.already_exists(rtype.group, rtype.plural, meta["name"])
        if rtype.namespaced:
            self._check_namespace_open(meta["namespace"], rtype)
        stored = copy.deepcopy(obj)
        if rtype.key == CRDS:
            self._establish_crd(stored)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        bucket[slot] = stored
        self._uids[meta["uid"]] = (rtype.key, slot[0], slot[1])
        self._emit("ADDED", rtype.key, stored)
        return self._view(rtype, stored)

    def create(self, rtype: ResourceType, namespace: str | None, body: Any) -> JSON:
        return self.commit_create(rtype, self.prepare_create(rtype, namespace, body))

    def _check_name(self, rtype: ResourceType, name: Any) -> None:
        pattern = _LABEL if rtype.key == NAMESPACES else builtinrules.SUBDOMAIN
        if not isinstance(name, str) or len(name) > 253 or not pattern.fullmatch(name):
            what = "RFC 1123 label" if rtype.key == NAMESPACES else "RFC 1123 subdomain"
            raise errors.invalid_object(
                rtype.group,
                rtype.kind,
                str(name),
                [
                    errors.invalid(
                        "metadata.name",
                        name,
                        f"a lowercase {what} must consist of lower case alphanumeric characters, '-' or '.', "
                        "and must start and end with an alphanumeric character",
                    )
                ],
            )

    def _check_namespace_open(self, namespace: str, rtype: ResourceType) -> None:
        ns_obj = self._bucket(NAMESPACES).get(("", namespace))
        if ns_obj is None:
            raise errors.APIError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        if ns_obj["metadata"].get("deletionTimestamp"):
            raise errors.forbidden_request(
                f"{rtype.plural} is forbidden: unable to create new content in namespace {namespace} "
                "because it is being terminated",
                rtype.group,
                rtype.plural,
            )

    def _defaults_on_create(self, rtype: ResourceType, obj: JSON) -> None:
        if rtype.key == NAMESPACES:
            obj.setdefault("spec", {})["finalizers"] = [NAMESPACE_FINALIZER]
            obj["status"] = {"phase": "Active"}
            labels = obj["metadata"].setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rtype.key == PODS:
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rtype.key == ("", "secrets"):
            obj.setdefault("type", "Opaque")
            self._fold_string_data(obj)

    @staticmethod
    def _fold_string_data(obj: JSON) -> None:
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            data = obj.setdefault("data", {})
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()

    # ----------------------------------------------------------------------------- validation

    def _validate(self, rtype: ResourceType, obj: JSON, old: JSON | None) -> JSON:
        problems: list[errors.FieldError] = []
        meta = obj["metadata"]
        for field_name in ("labels", "annotations"):
            value = meta.get(field_name)
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
            ):
                problems.append(errors.invalid(f"metadata.{field_name}", value, "values must be strings"))
        finalizers = meta.get("finalizers")
        if finalizers is not None and (
            not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers)
        ):
            problems.append(errors.invalid("metadata.finalizers", finalizers, "must be a list of strings"))
        if old is not None and old["metadata"].get("deletionTimestamp") and isinstance(finalizers, list):
            added = [f for f in finalizers if f not in (old["metadata"].get("finalizers") or [])]
            if added:
                listed = ", ".join(f'"{f}"' for f in added)
                problems.append(
                    errors.forbidden(
                        "metadata.finalizers",
                        f"no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers []string{{{listed}}}",
                    )
                )
        refs = meta.get("ownerReferences")
        if refs is not None:
            if not isinstance(refs, list):
                problems.append(errors.invalid("metadata.ownerReferences", refs, "must be a list"))
            else:
                for index, ref in enumerate(refs):
                    for required_key in ("apiVersion", "kind", "name", "uid"):
                        if not isinstance(ref, dict) or not ref.get(required_key):
                            problems.append(
                                errors.required(f"metadata.ownerReferences[{index}].{required_key}")
                            )
                controllers = [r for r in refs if isinstance(r, dict) and r.get("controller")]
                if len(controllers) > 1:
                    problems.append(
                        errors.invalid(
                            "metadata.ownerReferences",
                            refs,
                            "Only one reference can have Controller set to true",
                        )
                    )
        problems.extend(builtinrules.metadata_problems(meta))
        if not rtype.custom:
            problems.extend(builtinrules.kind_problems(rtype.key, obj, old))
        if rtype.custom and rtype.schema:
            obj, schema_problems = schema.apply_schema(obj, rtype.schema)
            problems.extend(schema_problems)
        if rtype.key == CRDS:
            problems.extend(validate_crd(obj))
        if rtype.key == PDBS:
            problems.extend(_validate_pdb(obj))
        if rtype.key == WEBHOOK_CONFIGS:
            problems.extend(_validate_webhook_names(obj))
        if problems:
            raise errors.invalid_object(rtype.group, rtype.kind, str(meta.get("name", "")), problems)
        return obj

    # ----------------------------------------------------------------------------- update / patch

    def prepare_update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None = None,
        manager: str | None = None,
    ) -> tuple[JSON, JSON]:
        """(old, new) for a PUT; raises 409 on a stale resourceVersion."""
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of a {rtype.kind} update must be a JSON object")
        bodytype.check_written(rtype, body)
        old = self._view(rtype, self._stored(rtype, namespace, name))
        body_meta: JSON = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        body_name = body_meta.get("name")
        if body_name and body_name != name:
            raise errors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        body_rv = body_meta.get("resourceVersion")
        if body_rv:
            if str(body_rv) != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rtype.group, rtype.plural, name)
        elif not rtype.unconditional_update and subresource is None:
            raise errors.invalid_object(
                rtype.group,
                rtype.kind,
                name,
                [
                    errors.FieldError(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        return old, self._build_update(rtype, old, copy.deepcopy(body), subresource, manager)

    def prepare_patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str | None = None,
        manager: str | None = None,
    ) -> tuple[JSON, JSON]:
        """(old, new) for a PATCH of the given content type (server-side apply has ``prepare_apply``).
        ``old`` is the stored version itself under a read-only view: nothing may change it."""
        old = self._read_view(rtype, self._stored(rtype, namespace, name))
        patched = patched_document(old, content_type, patch, strategic=not rtype.custom)
        if subresource is None and content_type != STRATEGIC_PATCH:
            bodytype.check_patched(rtype, name, patched)
        patched_meta: JSON = patched["metadata"] if isinstance(patched.get("metadata"), dict) else {}
        if patched_meta.get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({patched_meta.get('name')}) "
                f"does not match the name on the URL ({name})"
            )
        if str(patched_meta.get("resourceVersion", "")) not in ("", old["metadata"]["resourceVersion"]):
            raise errors.conflict(rtype.group, rtype.plural, name)
        return old, self._build_update(rtype, old, patched, subresource, manager)

    def prepare_apply(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        applied: Any,
        manager: str,
        *,
        force: bool,
        subresource: str | None = None,
    ) -> tuple[JSON | None, JSON]:
        """(old, new) for a server-side apply by ``manager``; old is None when the apply creates the object.

        Raises 409 Conflict naming each field another manager owns that the apply would change, unless
        ``force`` (then the fields change owner)."""
        found = self.find(rtype, namespace, name)
        if found is None and subresource is not None:
            raise errors.not_found(rtype.group, rtype.plural, name)
        if not isinstance(applied, dict):
            raise errors.bad_request("the applied configuration must be an object")
        applied_meta: JSON = applied["metadata"] if isinstance(applied.get("metadata"), dict) else {}
        if applied_meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({applied_meta.get('name')}) "
                f"does not match the name on the URL ({name})"
            )
        if applied.get("apiVersion") != rtype.api_version or applied.get("kind") != rtype.kind:
            raise errors.bad_request(
                f"the applied configuration must have apiVersion {rtype.api_version} and kind {rtype.kind}"
            )
        scope: tuple[str, ...] | None = ("f:status",) if subresource == "status" else None
        if subresource is None and rtype.has_status:
            applied = {k: v for k, v in applied.items() if k != "status"}
        try:
            merged, managed = fieldmanager.apply(
                found,
                applied,
                manager=manager,
                schema=fieldmanager.object_schema(rtype.schema),
                force=force,
                api_version=rtype.api_version,
                now=self.now(),
                subresource=subresource or "",
                scope=scope,
            )
        except fieldmanager.ApplyConflict as exc:
            raise _apply_conflict(rtype, name, exc.conflicts) from None
        merged.setdefault("metadata", {})["name"] = name
        if found is None:
            created = self.prepare_create(rtype, namespace, merged)
            created["metadata"]["managedFields"] = managed
            return None, created
        merged_meta = merged["metadata"]
        if str(merged_meta.get("resourceVersion", "")) != found["metadata"]["resourceVersion"]:
            raise errors.conflict(rtype.group, rtype.plural, name)
        return found, self._build_update(rtype, found, merged, subresource, managed=managed)

    def prepare_scale(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        change: Callable[[JSON], Any],
        manager: str | None = None,
    ) -> tuple[JSON, JSON]:
        """(old, new) for a write of the ``scale`` subresource: ``change`` turns the object's current
        ``Scale`` into the written one, whose ``spec.replicas`` lands at the CRD's specReplicasPath."""
        old = self._view(rtype, self._stored(rtype, namespace, name))
        written = change(scale.view(rtype, old))
        if not isinstance(written, dict):
            raise errors.bad_request("the body of a Scale write must be a JSON object")
        written_meta: JSON = written["metadata"] if isinstance(written.get("metadata"), dict) else {}
        if str(written_meta.get("resourceVersion") or old["metadata"]["resourceVersion"]) != str(
            old["metadata"]["resourceVersion"]
        ):
            raise errors.conflict(rtype.group, rtype.plural, name)
        new = scale.with_replicas(rtype, old, scale.replicas_of(written))
        new = self._build_update(rtype, old, new, None)
        if manager:
            managed = self._record(rtype, old, new, manager, "scale")
            if managed:
                new["metadata"]["managedFields"] = managed
        return old, new

    def _record(
        self, rtype: ResourceType, old: JSON | None, new: JSON, manager: str, subresource: str | None
    ) -> list[JSON]:
        return fieldmanager.record_update(
            old,
            new,
            manager=manager,
            schema=fieldmanager.object_schema(rtype.schema),
            api_version=rtype.api_version,
            now=self.now(),
            subresource=subresource or "",
        )

    def _build_update(
        self,
        rtype: ResourceType,
        old: JSON,
        new: JSON,
        subresource: str | None,
        manager: str | None = None,
        *,
        managed: list[JSON] | None = None,
    ) -> JSON:
        """The object an update of ``old`` stores. Field ownership: ``managed`` when given (an apply),
        else ``manager`` gains what it changed, else ownership stays as it was."""
        old_meta = old["metadata"]
        if subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            new = result
        else:
            meta = _meta(new)
            if meta.get("uid") and meta["uid"] != old_meta["uid"]:
                raise errors.invalid_object(
                    rtype.group,
                    rtype.kind,
                    old_meta["name"],
                    [errors.invalid("metadata.uid", meta["uid"], "field is immutable")],
                )
            for field_name in _SERVER_META:
                if field_name in old_meta:
                    meta[field_name] = old_meta[field_name]
                else:
                    meta.pop(field_name, None)
            meta["name"] = old_meta["name"]
            if "namespace" in old_meta:
                meta["namespace"] = old_meta["namespace"]
            else:
                meta.pop("namespace", None)
            meta.pop("managedFields", None)
            if rtype.has_status:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            if rtype.key == ("", "secrets"):
                self._fold_string_data(new)
            if rtype.key == NAMESPACES:
                new["spec"] = old.get("spec", {})
        new["apiVersion"] = rtype.api_version
        new["kind"] = rtype.kind
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        new = self._validate(rtype, new, old)
        if _strip(new, status=rtype.has_status) != _strip(old, status=rtype.has_status):
            new["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        if managed is not None:
            new["metadata"]["managedFields"] = managed
        elif manager:
            new["metadata"]["managedFields"] = self._record(rtype, old, new, manager, subresource)
        elif "managedFields" in old_meta:
            new["metadata"]["managedFields"] = copy.deepcopy(old_meta["managedFields"])
        if not new["metadata"].get("managedFields"):
            new["metadata"].pop("managedFields", None)
        return new

    def commit_update(self, rtype: ResourceType, old: JSON, new: JSON) -> JSON:
        """Store ``new`` if the object is still at ``old``'s resourceVersion (409 Conflict otherwise)."""
        meta = old["metadata"]
        slot = (meta.get("namespace", ""), meta["name"])
        current = self._bucket(rtype.key).get(slot)
        if current is None:
            raise errors.not_found(rtype.group, rtype.plural, meta["name"])
        if current["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise errors.conflict(rtype.group, rtype.plural, meta["name"])
        # ``new`` was built for this write alone (``prepare_*``), so it is stored as it is.
        return self._view(rtype, self._replace(rtype.key, current, new))

    def update(
        self, rtype: ResourceType, namespace: str | None, name: str, body: Any, subresource: str | None = None
    ) -> JSON:
        old, new = self.prepare_update(rtype, namespace, name, body, subresource)
        return self.commit_update(rtype, old, new)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str | None = None,
    ) -> JSON:
        old, new = self.prepare_patch(rtype, namespace, name, content_type, patch, subresource)
        return self.commit_update(rtype, old, new)

    def _replace(self, key: Key, current: JSON, new: JSON) -> JSON:
        """Write ``new`` over ``current`` (same slot); emits MODIFIED, then removes it if fully finalized."""
        if key == CRDS:
            self._establish_crd(new, keep_conditions=current.get("status"))
        if _same_content(current, new):
            return current
        meta = new["metadata"]
        slot = (meta.get("namespace", ""), meta["name"])
        meta["resourceVersion"] = self._next_rv()
        old = current
        self._bucket(key)[slot] = new
        self._emit("MODIFIED", key, new, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not self._held_by_spec(key, new):
            return self._remove(key, new)
        return new

    def _held_by_spec(self, key: Key, obj: JSON) -> bool:
        return key == NAMESPACES and bool((obj.get("spec") or {}).get("finalizers"))

    # ----------------------------------------------------------------------------- delete

    def prepare_delete(
        self, rtype: ResourceType, namespace: str | None, name: str, preconditions: JSON | None = None
    ) -> JSON:
        old = self._view(rtype, self._stored(rtype, namespace, name))
        if preconditions:
            uid = preconditions.get("uid")
            rv = preconditions.get("resourceVersion")
            if uid and uid != old["metadata"]["uid"]:
                raise errors.conflict(
                    rtype.group,
                    rtype.plural,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, "
                    f"UID in object meta: {old['metadata']['uid']}",
                )
            if rv and str(rv) != old["metadata"]["resourceVersion"]:
                raise errors.conflict(
                    rtype.group,
                    rtype.plural,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {rv}, "
                    f"ResourceVersion in object meta: {old['metadata']['resourceVersion']}",
                )
        return old

    def delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        preconditions: JSON | None = None,
    ) -> JSON:
        """Delete (or start deleting) an object; returns it as it is afterwards (or as it was at removal)."""
        if propagation not in (None, "", "Background", "Foreground", "Orphan"):
            raise errors.bad_request(
                f"propagationPolicy: Unsupported value: {propagation!r}: supported values: "
                '"Background", "Foreground", "Orphan"'
            )
        self.prepare_delete(rtype, namespace, name, preconditions)
        stored = self._stored(rtype, namespace, name)
        return self._view(rtype, self._delete_object(rtype.key, stored, propagation or "Background"))

    def delete_collection(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: Selector = (),
        fields: FieldSelector = (),
        *,
        propagation: str | None = None,
    ) -> JSON:
        deleted = []
        for obj in list(self.matching(rtype, namespace, labels, fields)):
            deleted.append(
                self._view(rtype, self._delete_object(rtype.key, obj, propagation or "Background"))
            )
        return {
            "kind": rtype.list_kind,
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": deleted,
        }

    def _delete_object(self, key: Key, stored: JSON, propagation: str) -> JSON:
        meta = stored["metadata"]
        if key == NAMESPACES:
            return self._terminate_namespace(stored)
        if key == CRDS:
            return self._terminate_crd(stored)
        uid = meta["uid"]
        finalizers = list(meta.get("finalizers") or [])
        if propagation == "Orphan":
            self._orphan_dependents(uid)
        elif propagation == "Foreground" and self._dependents(uid) and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        if not finalizers:
            return self._remove(key, stored)
        if meta.get("deletionTimestamp") and finalizers == list(meta.get("finalizers") or []):
            return stored
        new = copy.deepcopy(stored)
        new_meta = new["metadata"]
        new_meta["finalizers"] = finalizers
        if not new_meta.get("deletionTimestamp"):
            new_meta["deletionTimestamp"] = self.now()
            new_meta["deletionGracePeriodSeconds"] = 0
            new_meta["generation"] = int(new_meta.get("generation", 1)) + 1
        result = self._replace(key, stored, new)
        if FOREGROUND in finalizers:
            self._foreground.add(uid)
            for dep_key, dep in self._dependents(uid):
                if not dep["metadata"].get("deletionTimestamp"):
                    self._delete_object(dep_key, dep, "Background")
            self._settle_foreground(uid)
        return result

    def _remove(self, key: Key, stored: JSON) -> JSON:
        meta = stored["metadata"]
        slot = (meta.get("namespace", ""), meta["name"])
        bucket = self._bucket(key)
        if bucket.get(slot) is not stored:
            current = bucket.get(slot)
            return current if current is not None else stored
        del bucket[slot]
        self._uids.pop(meta["uid"], None)
        self._foreground.discard(meta["uid"])
        final = copy.deepcopy(stored)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("DELETED", key, final)
        if key == CRDS:
            self._unregister_crd(final)
        self._collect_dependents(meta["uid"])
        for ref in meta.get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("uid") in self._foreground:
                self._settle_foreground(ref["uid"])
        namespace = meta.get("namespace")
        if namespace and namespace in self._terminating_ns:
            self._settle_namespace(namespace)
        if key[1] and key != CRDS:
            crd_name = self.registry.crd_name_for(key)
            if crd_name and crd_name in self._terminating_crds:
                self._settle_crd(crd_name)
        return final

    # ----------------------------------------------------------------------------- garbage collection

    def _dependents(self, uid: str) -> list[tuple[Key, JSON]]:
        found = []
        for key, bucket in self._objects.items():
            for obj in bucket.values():
                refs = obj["metadata"].get("ownerReferences") or []
                if any(isinstance(r, dict) and r.get("uid") == uid for r in refs):
                    found.append((key, obj))
        return found

    def _collect_dependents(self, uid: str) -> None:
        for key, dep in self._dependents(uid):
            refs = dep["metadata"].get("ownerReferences") or []
            owners_alive = any(isinstance(r, dict) and r.get("uid") in self._uids for r in refs)
            if not owners_alive and not dep["metadata"].get("deletionTimestamp"):
                current = self._bucket(key).get(
                    (dep["metadata"].get("namespace", ""), dep["metadata"]["name"])
                )
                if current is dep:
                    self._delete_object(key, dep, "Background")

    def _orphan_dependents(self, uid: str) -> None:
        for key, dep in self._dependents(uid):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            self._replace(key, dep, new)

    def _settle_foreground(self, uid: str) -> None:
        where = self._uids.get(uid)
        if where is None or self._dependents(uid):
            return
        key, ns, name = where
        owner = self._bucket(key)[(ns, name)]
        new = copy.deepcopy(owner)
        new["metadata"]["finalizers"] = [
            f for f in owner["metadata"].get("finalizers") or [] if f != FOREGROUND
        ]
        if not new["metadata"]["finalizers"]:
            new["metadata"].pop("finalizers")
        self._foreground.discard(uid)
        self._replace(key, owner, new)

    # ----------------------------------------------------------------------------- namespaces

    def _terminate_namespace(self, stored: JSON) -> JSON:
        name = stored["metadata"]["name"]
        if not stored["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(stored)
            new["metadata"]["deletionTimestamp"] = self.now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["status"] = {"phase": "Terminating"}
            stored = self._replace(NAMESPACES, stored, new)
        self._terminating_ns.add(name)
        for key, bucket in list(self._objects.items()):
            for slot, obj in list(bucket.items()):
                inside = slot[0] == name and key != NAMESPACES
                if inside and not obj["metadata"].get("deletionTimestamp") and bucket.get(slot) is obj:
                    self._delete_object(key, obj, "Background")
        self._settle_namespace(name)
        return self._bucket(NAMESPACES).get(("", name), stored)

    def _settle_namespace(self, name: str) -> None:
        if any(slot[0] == name for key, b in self._objects.items() if key != NAMESPACES for slot in b):
            return
        current = self._bucket(NAMESPACES).get(("", name))
        self._terminating_ns.discard(name)
        if current is None:
            return
        new = copy.deepcopy(current)
        new["spec"] = {k: v for k, v in (new.get("spec") or {}).items() if k != "finalizers"}
        if (current.get("spec") or {}).get("finalizers"):
            self._replace(NAMESPACES, current, new)
        elif not current["metadata"].get("finalizers"):
            self._remove(NAMESPACES, current)

    def finalize_namespace(self, name: str, body: Any) -> JSON:
        """``PUT /api/v1/namespaces/{name}/finalize``: set ``spec.finalizers`` (an empty list finishes it)."""
        rtype = self.registry.require("", "v1", "namespaces")
        stored = self._stored(rtype, None, name)
        new = copy.deepcopy(stored)
        finalizers = ((body or {}).get("spec") or {}).get("finalizers") if isinstance(body, dict) else None
        new.setdefault("spec", {})["finalizers"] = list(finalizers or [])
        if not new["spec"]["finalizers"]:
            new["spec"].pop("finalizers")
        return self._view(rtype, self._replace(NAMESPACES, stored, new))

    # ----------------------------------------------------------------------------- CRDs

    def _establish_crd(self, crd: JSON, keep_conditions: Any = None) -> None:
        """Fill the status a healthy apiextensions controller would, and serve the CRD's resources."""
        spec = crd.get("spec") or {}
        names = dict(spec.get("names") or {})
        names.setdefault("singular", str(names.get("kind", "")).lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        old_conditions = (
            (keep_conditions or {}).get("conditions") if isinstance(keep_conditions, dict) else None
        )
        now = self.now()
        conditions = old_conditions or [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now,
            },
        ]
        if crd["metadata"].get("deletionTimestamp"):
            conditions = [c for c in conditions if c.get("type") != "Terminating"] + [
                {
                    "type": "Terminating",
                    "status": "True",
                    "reason": "InstanceDeletionInProgress",
                    "message": "CustomResource deletion is in progress",
                    "lastTransitionTime": now,
                }
            ]
        storage = [v["name"] for v in spec.get("versions") or [] if isinstance(v, dict) and v.get("storage")]
        stored_versions = (
            list((keep_conditions or {}).get("storedVersions") or [])
            if isinstance(keep_conditions, dict)
            else []
        )
        for version in storage:
            if version not in stored_versions:
                stored_versions.append(version)
        crd["status"] = {"conditions": conditions, "acceptedNames": names, "storedVersions": stored_versions}
        self.registry.register_crd(crd)

    def _terminate_crd(self, stored: JSON) -> JSON:
        name = stored["metadata"]["name"]
        types = [t for t in self.registry.types() if self.registry.crd_name_for(t.key) == name]
        if not types:
            return self._remove(CRDS, stored)
        if not stored["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(stored)
            new["metadata"]["deletionTimestamp"] = self.now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            finalizers = list(new["metadata"].get("finalizers") or [])
            if CRD_CLEANUP not in finalizers:
                finalizers.append(CRD_CLEANUP)
            new["metadata"]["finalizers"] = finalizers
            stored = self._replace(CRDS, stored, new)
        self._terminating_crds.add(name)
        key = types[0].key
        for obj in list(self._bucket(key).values()):
            if (
                not obj["metadata"].get("deletionTimestamp")
                and self._bucket(key).get((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
                is obj
            ):
                self._delete_object(key, obj, "Background")
        self._settle_crd(name)
        return self._bucket(CRDS).get(("", name), stored)

    def _settle_crd(self, name: str) -> None:
        types = [t for t in self.registry.types() if self.registry.crd_name_for(t.key) == name]
        if types and self._bucket(types[0].key):
            return
        current = self._bucket(CRDS).get(("", name))
        self._terminating_crds.discard(name)
        if current is None:
            return
        new = copy.deepcopy(current)
        new["metadata"]["finalizers"] = [
            f for f in current["metadata"].get("finalizers") or [] if f != CRD_CLEANUP
        ]
        if not new["metadata"]["finalizers"]:
            new["metadata"].pop("finalizers")
        self._replace(CRDS, current, new)

    def _unregister_crd(self, crd: JSON) -> None:
        removed = self.registry.unregister_crd(crd["metadata"]["name"])
        for rtype in removed:
            self._objects.pop(rtype.key, None)

    # ----------------------------------------------------------------------------- evictions

    def evict(self, namespace: str, name: str, body: Any) -> None:
        """Evict a pod: 429 when a PodDisruptionBudget (or the test blocker) forbids it, else delete it."""
        pods = self.registry.require("", "v1", "pods")
        stored = self._stored(pods, namespace, name)
        if body is not None and not isinstance(body, dict):
            raise errors.bad_request("an Eviction body must be a JSON object")
        body_meta = (body or {}).get("metadata") or {}
        if body_meta.get("name") and body_meta["name"] != name:
            raise errors.bad_request("name in URL does not match name in Eviction object")
        if self.eviction_blocker is not None:
            reason = self.eviction_blocker(copy.deepcopy(stored))
            if reason:
                raise errors.too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    [{"reason": "DisruptionBudget", "message": reason}],
                    retry_after=0,
                )
        if not stored["metadata"].get("deletionTimestamp") and _is_healthy(stored):
            self._check_budgets(namespace, stored)
        options = (body or {}).get("deleteOptions") or {}
        self.prepare_delete(pods, namespace, name, options.get("preconditions"))
        self._delete_object(pods.key, stored, options.get("propagationPolicy") or "Background")

    def _check_budgets(self, namespace: str, pod: JSON) -> None:
        pdb_type = self.registry.require("policy", "v1", "poddisruptionbudgets")
        pods_type = self.registry.require("", "v1", "pods")
        for pdb in self.matching(pdb_type, namespace):
            selector = selector_from_object((pdb.get("spec") or {}).get("selector"), "spec.selector")
            if not selector or not matches_labels(selector, pod):
                continue
            covered = [
                p
                for p in self.matching(pods_type, namespace, selector)
                if not p["metadata"].get("deletionTimestamp")
            ]
            healthy = sum(1 for p in covered if _is_healthy(p))
            desired = _desired_healthy(pdb.get("spec") or {}, len(covered))
            if healthy - 1 < desired:
                pdb_name = pdb["metadata"]["name"]
                raise errors.too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb_name} needs {desired} healthy pods "
                            f"and has {healthy} currently",
                        }
                    ],
                )


def _is_healthy(pod: JSON) -> bool:
    """A pod counts as healthy for a disruption budget when its Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        percent = int(value[:-1])
        scaled = total * percent / 100
        return int(-(-scaled // 1)) if round_up else int(scaled // 1)
    return int(value)


def _desired_healthy(spec: JSON, total: int) -> int:
    if spec.get("minAvailable") is not None:
        return _scaled(spec["minAvailable"], total, round_up=True)
    if spec.get("maxUnavailable") is not None:
        return max(0, total - _scaled(spec["maxUnavailable"], total, round_up=True))
    return 0


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _validate_webhook_names(obj: JSON) -> list[errors.FieldError]:
    """Each webhook's name is a DNS subdomain of at least three labels, as kube-apiserver requires."""
    problems = []
    webhooks = obj.get("webhooks") or []
    for index, hook in enumerate(webhooks if isinstance(webhooks, list) else []):
        name = hook.get("name") if isinstance(hook, dict) else None
        path = f"webhooks[{index}].name"
        if not name:
            problems.append(errors.required(path))
            continue
        labels = str(name).split(".")
        if len(labels) < 3:
            problems.append(
                errors.invalid(
                    path, name, "should be a domain with at least three segments separated by dots"
                )
            )
        elif len(str(name)) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
            problems.append(
                errors.invalid(
                    path,
                    name,
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
                    "or '.', and must start and end with an alphanumeric character",
                )
            )
    return problems


def _validate_pdb(obj: JSON) -> list[errors.FieldError]:
    spec = obj.get("spec") or {}
    problems = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        problems.append(errors.invalid("spec", spec, "minAvailable and maxUnavailable cannot be both set"))
    for field_name in ("minAvailable", "maxUnavailable"):
        value = spec.get(field_name)
        if value is None:
            continue
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
            isinstance(value, str) and re.fullmatch(r"\d+%", value) is not None
        )
        if not ok:
            problems.append(
                errors.invalid(f"spec.{field_name}", value, "must be a non-negative integer or a percentage")
            )
    try:
        selector_from_object(spec.get("selector"), "spec.selector")
    except errors.APIError as exc:
        problems.append(errors.invalid("spec.selector", spec.get("selector"), exc.message))
    return problems


def _encode_continue(rv: int, start: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "start": list(start)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        raise errors.bad_request(
            "continue key is not valid: the token must be the metadata.continue value of an earlier list"
        ) from None


def _apply_conflict(
    rtype: ResourceType, name: str, conflicts: list[fieldmanager.Conflict]
) -> errors.APIError:
    """409 Conflict for an apply, in the real server's words (one cause per field)."""
    lines = [f"{c.describe()}: {fieldmanager.readable(c.path)}" for c in conflicts]
    count = f"{len(conflicts)} conflict" + ("s" if len(conflicts) != 1 else "")
    message = f"Apply failed with {count}: " + ("\n".join(lines) if len(lines) > 1 else lines[0])
    details: JSON = {"name": name, "kind": rtype.plural, "causes": []}
    if rtype.group:
        details["group"] = rtype.group
    details["causes"] = [
        {"reason": "FieldManagerConflict", "message": c.describe(), "field": fieldmanager.readable(c.path)}
        for c in conflicts
    ]
    return errors.APIError(409, "Conflict", message, details)


def patched_document(doc: JSON, content_type: str, patch: Any, *, strategic: bool) -> JSON:
    """``doc`` with a JSON, merge or (when the kind allows it) strategic merge patch applied; a new object."""
    try:
        if content_type == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise errors.bad_request("a merge patch must be a JSON object")
            patched = patches.merge_patch(doc, patch)
        elif content_type == JSON_PATCH:
            patched = patches.json_patch(doc, patch)
        elif content_type == STRATEGIC_PATCH and strategic:
            if not isinstance(patch, dict):
                raise errors.bad_request("a strategic merge patch must be a JSON object")
            patched = patches.strategic_merge_patch(doc, patch)
        else:
            raise errors.unsupported_media_type(
                content_type, [JSON_PATCH, MERGE_PATCH] + ([STRATEGIC_PATCH] if strategic else [])
            )
    except patches.PatchError as exc:
        if exc.malformed:
            raise errors.bad_request(str(exc)) from None
        raise errors.unprocessable(str(exc)) from None
    if not isinstance(patched, dict):
        raise errors.bad_request("the patch replaced the whole object with a non-object")
    return copy.deepcopy(patched)  # a merge patch shares untouched parts with ``doc``
