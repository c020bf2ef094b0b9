"""Config hashes of a merged group and the group ETag.

* ``runtime_hash``: ``"sha256:" + hex`` over ``{vars, files}``: what can be pushed to running
  instances (a mismatch makes the server regenerate and push files);
* ``infra_hash``: ``"sha256:" + hex`` over ``{args, instance_type, subnet_pool, userdata, kind,
  arch}``: what needs a new VM (a mismatch rotates instances one at a time).

Both hash canonical JSON: ``json.dumps(value, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` encoded as UTF-8, so key order in the config never matters. Models are dumped
with ``exclude_defaults=True`` so adding a new optional field later does not change every hash
(and, with it, rotate every instance). Hashes are computed before rendering. Pure functions.

These are our own hashes: they are compared only with values this implementation wrote.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nstance.config.merge import MergedGroupConfig


def canonical_json(value: Any) -> bytes:
    """Sorted-key, compact, UTF-8 JSON: the byte string every hash here is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _sha256(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def runtime_hash(merged: MergedGroupConfig) -> str:
    """Hash of the pushable part of a group's config (vars and files)."""
    files = {name: f.model_dump(mode="json", exclude_defaults=True) for name, f in merged.files.items()}
    return _sha256({"vars": merged.vars, "files": files})


def infra_hash(merged: MergedGroupConfig) -> str:
    """Hash of the part of a group's config that only a new VM can pick up."""
    userdata = merged.userdata.model_dump(mode="json", exclude_defaults=True) if merged.userdata else None
    return _sha256(
        {
            "args": merged.args,
            "instance_type": merged.instance_type,
            "subnet_pool": merged.subnet_pool,
            "userdata": userdata,
            "kind": merged.kind,
            "arch": merged.arch,
        }
    )


def group_etag(
    key: str,
    tenant: str,
    template: str,
    size: int,
    instance_type: str,
    subnet_pool: str,
    vars: Mapping[str, str],
    is_static: bool,
) -> str:
    """ETag of a group's desired state as reported in ``GroupStatus.etag``.

    MD5 hex of ``canonical_json`` of the object ``{"instance_type", "is_static", "key", "size",
    "subnet_pool", "template", "tenant", "vars"}`` (keys sorted; unset strings are ``""``); runtime
    fields such as actual size are not included, so the ETag changes only when the config does.
    """
    document = {
        "key": key,
        "tenant": tenant,
        "template": template,
        "size": size,
        "instance_type": instance_type,
        "subnet_pool": subnet_pool,
        "vars": dict(vars),
        "is_static": is_static,
    }
    return hashlib.md5(canonical_json(document), usedforsecurity=False).hexdigest()
