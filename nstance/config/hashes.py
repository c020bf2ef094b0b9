"""Config hashes of a merged group and the group ETag.

* ``runtime_hash``: ``"sha256:" + hex`` over ``{vars, files}``: what can be pushed to running
  instances (a mismatch makes the server regenerate and push files);
* ``infra_hash``: ``"sha256:" + hex`` over ``{args, instance_type, subnet_pool, userdata, kind,
  arch}``: what needs a new VM (a mismatch rotates instances one at a time).

Both are upstream's hashes byte for byte (``internal/server/config/hash.go``): SHA-256 of Go's
``json.Marshal`` of a struct with those fields in that order (``userdata`` left out when there is
none), files and userdata shaped as ``nstance.config.goshapes`` describes, maps with sorted keys,
numbers in ``args`` and file templates printed as Go prints the float64 it decoded. So an instance
record a Go server wrote matches here, and an agent's reported hash matches on either server.
Hashes are computed before rendering. Pure functions.

``legacy_runtime_hash`` and ``legacy_infra_hash`` are the hashes earlier versions of this project
wrote (SHA-256 of ``canonical_json`` of the same fields, models dumped without their defaults). They
are never written: a stored hash equal to the legacy one of the group's current config still counts
as matching, so an upgrade neither rotates every VM nor pushes every file again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nstance.config.goshapes import file_struct, userdata_struct
from nstance.config.merge import MergedGroupConfig
from nstance.core.gojson import GoStruct, go_marshal


def canonical_json(value: Any) -> bytes:
    """Sorted-key, compact, UTF-8 JSON (what ``group_etag`` and the legacy hashes are computed over)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def runtime_json(merged: MergedGroupConfig) -> bytes:
    """The bytes ``runtime_hash`` is computed over: Go's ``json.Marshal`` of ``{vars, files}``."""
    files = {name: file_struct(f) for name, f in merged.files.items()}
    return go_marshal(GoStruct(vars=merged.vars, files=files))


def infra_json(merged: MergedGroupConfig) -> bytes:
    """The bytes ``infra_hash`` is computed over: Go's ``json.Marshal`` of the infra fields."""
    value = GoStruct(args=merged.args, instance_type=merged.instance_type, subnet_pool=merged.subnet_pool)
    if merged.userdata is not None:
        value["userdata"] = userdata_struct(merged.userdata)
    value["kind"] = merged.kind
    value["arch"] = merged.arch
    return go_marshal(value)


def runtime_hash(merged: MergedGroupConfig) -> str:
    """Hash of the pushable part of a group's config (vars and files), as upstream computes it."""
    return _sha256(runtime_json(merged))


def infra_hash(merged: MergedGroupConfig) -> str:
    """Hash of the part of a group's config that only a new VM can pick up, as upstream computes it."""
    return _sha256(infra_json(merged))


def legacy_runtime_hash(merged: MergedGroupConfig) -> str:
    """``runtime_hash`` as earlier versions of this project computed it: only ever compared with."""
    files = {name: f.model_dump(mode="json", exclude_defaults=True) for name, f in merged.files.items()}
    return _sha256(canonical_json({"vars": merged.vars, "files": files}))


def legacy_infra_hash(merged: MergedGroupConfig) -> str:
    """``infra_hash`` as earlier versions of this project computed it: only ever compared with."""
    userdata = merged.userdata.model_dump(mode="json", exclude_defaults=True) if merged.userdata else None
    return _sha256(
        canonical_json(
            {
                "args": merged.args,
                "instance_type": merged.instance_type,
                "subnet_pool": merged.subnet_pool,
                "userdata": userdata,
                "kind": merged.kind,
                "arch": merged.arch,
            }
        )
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
