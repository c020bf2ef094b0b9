"""Upstream's config structs as Go's ``encoding/json`` writes them: field order and ``omitempty``.

Upstream hashes and stores its config types with ``json.Marshal``/``MarshalIndent`` of Go structs
(``internal/server/config/types.go``, the same in v1 and v2): a struct's fields come out in declaration
order, an ``omitempty`` field is left out when empty, and a nil pointer field too. These functions turn
this implementation's models into ``GoStruct`` values of the same shape, for ``nstance.core.gojson``:

* ``GroupConfig``: ``template``, ``size``, ``instance_type``, ``subnet_pool``, ``vars``, ``args``,
  ``drain_timeout``, ``load_balancers``, every one ``omitempty``; ``size`` and ``drain_timeout`` are
  pointers, so ``0`` and ``"0s"`` are written;
* ``FileConfig``: ``kind``; ``source`` unless empty; ``template`` unless absent (an empty string or
  object is written); ``key`` (``source``, ``name``) unless absent;
* ``UserdataConfig``: ``source`` and ``encoding`` only when the config wrote them (Go keeps the empty
  string it read and leaves it out; the defaults ``inline``/``plain`` are applied later), then
  ``content``.

Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nstance.config.workloads import FileConfig, UserdataConfig
from nstance.core.gojson import GoStruct

#: ``GroupConfig``'s JSON fields in upstream's declaration order (pydantic dumps ours in this order).
GROUP_FIELDS = (
    "template",
    "size",
    "instance_type",
    "subnet_pool",
    "vars",
    "args",
    "drain_timeout",
    "load_balancers",
)


def group_entry(dumped: Mapping[str, Any]) -> GoStruct:
    """A group entry as Go writes it, from its ``model_dump(mode="json", exclude_defaults=True)``.

    That dump has the fields in ``GROUP_FIELDS`` order and already lacks the unset ones (``None``)
    and the empty maps and lists; of Go's ``omitempty`` only an empty string is left to drop.
    """
    entry = GoStruct(dumped)
    if "" in entry.values():
        for name in [name for name, value in entry.items() if value == ""]:
            del entry[name]
    return entry


def file_struct(file: FileConfig) -> GoStruct:
    """A template file as Go's ``FileConfig`` marshals."""
    out = GoStruct(kind=file.kind)
    if file.source:
        out["source"] = file.source
    if file.template is not None:
        out["template"] = file.template
    if file.key is not None:
        out["key"] = GoStruct(source=file.key.source, name=file.key.name)
    return out


def userdata_struct(userdata: UserdataConfig) -> GoStruct:
    """Userdata as Go's ``UserdataConfig`` marshals: ``source``/``encoding`` only if written."""
    out = GoStruct()
    written = userdata.model_fields_set
    if "source" in written:
        out["source"] = userdata.source
    if "encoding" in written:
        out["encoding"] = userdata.encoding
    out["content"] = userdata.content
    return out
