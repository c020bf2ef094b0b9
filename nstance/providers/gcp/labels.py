"""GCE label rules and the ``nstance-*`` labels that carry Nstance's instance metadata.

GCE labels are the GCP counterpart of AWS tags (spec/groups-and-instances.md): keys start with a
lowercase letter, keys and values use only lowercase letters, digits, ``_`` and ``-``, both are at most
63 characters, and an instance has at most 64 labels. Nstance writes identifier (``nstance-instance-id``),
association (``nstance-managed``, ``nstance-cluster-id``, ``nstance-shard``) and annotation
(``nstance-group``, ``nstance-template``, ``nstance-instance-kind``, ``nstance-tenant``,
``nstance-created-at``) labels, plus ``nstance-create-token`` (a hash of the idempotency token, so a
second create of the same name can tell a retry from a conflicting request).

Pure functions; no I/O and no SDK imports. Values Nstance derives are made valid (lowercased,
other characters replaced, long values shortened with a hash suffix); labels the user writes in
``args.Labels`` are checked, not rewritten, and a bad one is refused naming its config path. A user
``nstance-*`` label is accepted only when it repeats what Nstance writes for that key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime

from nstance.providers.base import CreateRequest, ProviderInvalidRequest

PREFIX = "nstance-"
MANAGED = "nstance-managed"
INSTANCE_ID = "nstance-instance-id"
CLUSTER_ID = "nstance-cluster-id"
SHARD = "nstance-shard"
GROUP = "nstance-group"
TEMPLATE = "nstance-template"
KIND = "nstance-instance-kind"
TENANT = "nstance-tenant"
CREATED_AT = "nstance-created-at"
ON_DEMAND = "nstance-on-demand"
CREATE_TOKEN = "nstance-create-token"
MAX_LABELS = 64
MAX_LENGTH = 63

_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_INVALID = re.compile(r"[^a-z0-9_-]")


def _shorten(text: str) -> str:
    if len(text) <= MAX_LENGTH:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{text[: MAX_LENGTH - 9]}-{digest}"


def label_value(text: str) -> str:
    """``text`` as a valid label value: lowercased, other characters as ``-``, at most 63 characters.

    Distinct long inputs stay distinct (the hash suffix); identifiers Nstance validates (cluster,
    shard, group, instance ids) pass through unchanged.
    """
    return _shorten(_INVALID.sub("-", text.lower()))


def label_key(text: str) -> str:
    """``text`` as a valid label key (starts with a letter: ``k-`` is put in front otherwise)."""
    key = _INVALID.sub("_", text.lower())
    if not key or not key[0].isalpha() or not key[0].isascii():
        key = "k-" + key
    return _shorten(key)


def token_hash(token: str) -> str:
    """The ``nstance-create-token`` value for an idempotency token (not reversible)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:32]


def created_at_value(when: datetime) -> str:
    """``2026-01-01t12-30-00z``: an RFC 3339 UTC time with the characters labels forbid replaced."""
    return when.strftime("%Y-%m-%dt%H-%M-%Sz")


def nstance_labels(request: CreateRequest) -> dict[str, str]:
    """The labels Nstance owns on a VM it creates."""
    labels = {
        MANAGED: "true",
        INSTANCE_ID: label_value(request.instance_id),
        CLUSTER_ID: label_value(request.cluster_id),
        SHARD: label_value(request.shard),
        GROUP: label_value(request.group),
        TEMPLATE: label_value(request.template),
        KIND: label_value(request.kind),
        TENANT: label_value(request.tenant),
        CREATED_AT: created_at_value(request.created_at),
        CREATE_TOKEN: token_hash(request.idempotency_token or request.instance_id),
    }
    if request.on_demand:
        labels[ON_DEMAND] = "true"
    return labels


def merge_labels(
    request: CreateRequest, user_labels: Mapping[str, object], *, args_path: str
) -> dict[str, str]:
    """Custom tags (made valid), then ``args.Labels`` (checked), then Nstance's labels.

    A user label may use the ``nstance-`` prefix only to repeat the value Nstance writes for that key
    (upstream's v1 Terraform module sets ``nstance-managed`` and ``nstance-group`` this way); any other
    ``nstance-`` label is refused. More than 64 labels in all is refused.
    """
    own = nstance_labels(request)
    out: dict[str, str] = {}
    for key, value in request.tags.items():
        out[label_key(key)] = label_value(str(value))
    for key, raw in user_labels.items():
        path = f"{args_path}.Labels.{key}"
        if not isinstance(raw, str):
            raise ProviderInvalidRequest(f"{path}: a label value must be a string (got {raw!r})")
        value = raw
        if key.startswith(PREFIX):
            if own.get(key) == value:
                continue  # the same label Nstance writes
            wanted = f" (Nstance writes {own[key]!r} here)" if key in own else ""
            raise ProviderInvalidRequest(
                f"{path}: labels starting with {PREFIX!r} belong to Nstance{wanted}; choose another key"
            )
        if not _KEY.match(key):
            raise ProviderInvalidRequest(
                f"{path}: GCE label keys start with a lowercase letter and use only lowercase letters, "
                "digits, '_' and '-' (at most 63 characters)"
            )
        if not _VALUE.match(value):
            raise ProviderInvalidRequest(
                f"{path}: GCE label values use only lowercase letters, digits, '_' and '-' (at most 63 "
                f"characters); got {value!r}"
            )
        out[key] = value
    out.update(own)
    if len(out) > MAX_LABELS:
        raise ProviderInvalidRequest(
            f"{args_path}.Labels: a GCE instance takes at most {MAX_LABELS} labels and Nstance needs "
            f"{len(own)}; this request has {len(out)} - remove some custom tags or labels"
        )
    return out
