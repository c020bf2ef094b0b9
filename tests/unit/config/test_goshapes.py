"""Go's ``encoding/json`` output: values decoded from JSON, and struct shapes (members in declaration
order, ``omitempty`` as Go applies it, maps inside still sorted).

The ``marshal`` vectors of ``tests/fixtures/upstream/go-json-vectors.json`` are what a scratch Go program
printed for ``json.Marshal`` and ``json.MarshalIndent(v, "", "  ")`` of each document decoded into an
``interface{}`` (the fixtures' README.md says more).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nstance.config.goshapes import GROUP_FIELDS, file_struct, group_entry, userdata_struct
from nstance.config.workloads import DynamicGroupConfig, FileConfig, GroupConfig, UserdataConfig
from nstance.core.gojson import GoStruct, go_marshal, go_marshal_indent

VECTORS = Path(__file__).resolve().parents[2] / "fixtures" / "upstream" / "go-json-vectors.json"
MARSHAL = json.loads(VECTORS.read_text(encoding="utf-8"))["marshal"]


@pytest.mark.parametrize("case", MARSHAL, ids=[case["name"] for case in MARSHAL])
def test_documents_are_written_as_go_writes_what_it_decoded(case: dict[str, str]) -> None:
    value = json.loads(case["document"])
    assert go_marshal(value).decode("utf-8") == case["marshal"]
    assert go_marshal_indent(value).decode("utf-8") == case["indent"]


def test_a_struct_keeps_its_member_order_and_a_map_inside_it_is_sorted() -> None:
    value = GoStruct(z=1, a={"b": 2, "a": GoStruct(y=1, x=2)}, m=[GoStruct(), {}])
    assert go_marshal(value) == b'{"z":1,"a":{"a":{"y":1,"x":2},"b":2},"m":[{},{}]}'
    assert go_marshal_indent(GoStruct(b=1, a=2)) == b'{\n  "b": 1,\n  "a": 2\n}'


def test_group_fields_are_upstreams_and_pydantic_dumps_them_in_that_order() -> None:
    # group_entry relies on the dump's order: a field added to the model must be placed (and named in
    # GROUP_FIELDS) where upstream's GroupConfig declares it.
    assert tuple(GroupConfig.model_fields) == GROUP_FIELDS
    assert tuple(DynamicGroupConfig.model_fields) == GROUP_FIELDS


def test_a_group_entry_leaves_out_empty_strings_and_keeps_pointer_zeros() -> None:
    entry = DynamicGroupConfig.model_validate(
        {"load_balancers": ["lb"], "drain_timeout": "0s", "instance_type": "", "size": 0, "template": "t"}
    )
    dumped = entry.model_dump(mode="json", exclude_defaults=True)
    assert (
        go_marshal(group_entry(dumped))
        == b'{"template":"t","size":0,"drain_timeout":"0s","load_balancers":["lb"]}'
    )


def test_file_and_userdata_shapes() -> None:
    cert = FileConfig.model_validate(
        {"template": "tls", "key": {"name": "k.pub", "source": "agent"}, "kind": "certificate"}
    )
    assert (
        go_marshal(file_struct(cert))
        == b'{"kind":"certificate","template":"tls","key":{"source":"agent","name":"k.pub"}}'
    )
    empty = FileConfig.model_validate({"kind": "string", "template": ""})
    assert go_marshal(file_struct(empty)) == b'{"kind":"string","template":""}'
    secret = FileConfig.model_validate({"kind": "secret", "source": "db"})
    assert go_marshal(file_struct(secret)) == b'{"kind":"secret","source":"db"}'
    written = UserdataConfig.model_validate({"content": "x", "encoding": "plain", "source": "inline"})
    assert go_marshal(userdata_struct(written)) == b'{"source":"inline","encoding":"plain","content":"x"}'
    bare = UserdataConfig.model_validate({"content": "x", "encoding": None})
    assert go_marshal(userdata_struct(bare)) == b'{"content":"x"}'
