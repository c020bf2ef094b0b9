"""Rendering templates: Go-style references, refused Go constructs, strict undefined, the sandbox."""

from __future__ import annotations

import base64
import gzip

import pytest

from nstance.config import (
    ClusterData,
    InstanceData,
    ProviderData,
    RenderError,
    ServerData,
    TemplateData,
    decode_userdata,
    render_args,
    render_template,
)
from nstance.core.errors import InvalidArgument

DATA = TemplateData(
    instance=InstanceData(
        id="web01jexample",
        kind="web",
        arch="amd64",
        instance_type="t.small",
        hostname="web-1",
        fqdn="web-1.example.com",
        ip4="10.0.0.5",
        ip6="fd00::5",
    ),
    cluster=ClusterData(id="c1", ca_cert="-----BEGIN CERTIFICATE-----"),
    server=ServerData(
        shard="s1", registration_addr="10.0.0.1:8992", agent_addr="10.0.0.1:8994", operator_addr="o:1"
    ),
    provider=ProviderData(kind="aws", region="us-east-1", zone="us-east-1a"),
    vars={"role": "worker", "items": "shadowed-method-name"},
    image={"debian": "ami-123"},
    nonce="jwt.token.here",
)

NAME = "templates.web.userdata"


def render(source: str) -> str:
    return render_template(NAME, source, DATA)


def failure(source: str) -> str:
    with pytest.raises(RenderError) as info:
        render(source)
    return str(info.value)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ .Instance.ID }}", "web01jexample"),
        ("{{.Instance.ID}}", "web01jexample"),
        ("{{ Instance.ID }}", "web01jexample"),
        ("{{- .Vars.role -}}", "worker"),
        ("a {{- .Vars.role }}", "aworker"),
        ("{{ .Instance.Kind }}/{{ .Instance.Arch }}/{{ .Instance.Type }}", "web/amd64/t.small"),
        ("{{ .Instance.Hostname }} {{ .Instance.FQDN }} {{ .Instance.IP4 }} {{ .Instance.IP6 }}",
         "web-1 web-1.example.com 10.0.0.5 fd00::5"),
        ("{{ .Cluster.ID }} {{ .Cluster.CACert }}", "c1 -----BEGIN CERTIFICATE-----"),
        ("{{ .Server.Shard }} {{ .Server.RegistrationAddr }} {{.Server.AgentAddr}} {{.Server.OperatorAddr}}",
         "s1 10.0.0.1:8992 10.0.0.1:8994 o:1"),
        ("{{ .Provider.Kind }} {{ .Provider.Region }} {{ .Provider.Zone }}", "aws us-east-1 us-east-1a"),
        ("{{ .Image.debian }} {{ .Nonce }}", "ami-123 jwt.token.here"),
        ("{{ Vars.items }}", "shadowed-method-name"),
        ('{{ Vars["role"] }}', "worker"),
    ],
)  # fmt: skip
def test_go_style_and_jinja_references(source: str, expected: str) -> None:
    assert render(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{% if Vars.role == 'worker' %}yes{% else %}no{% endif %}", "yes"),
        ("{% for k in Vars %}{{ k }};{% endfor %}", "items;role;"),
        ("{{ Vars.role | upper }}", "WORKER"),
        ("{{ Vars.missing | default('x') }}", "x"),
        ("{{ '.Vars.role' }}", ".Vars.role"),
        ('{{ "a.b" ~ (.Vars.role) }}', "a.bworker"),
        ("{{ Vars.role if Nonce else 'none' }}", "worker"),
        ("{# a comment #}plain", "plain"),
        ("no markup at all {", "no markup at all {"),
    ],
)
def test_native_jinja_still_works(source: str, expected: str) -> None:
    assert render(source) == expected


def test_trailing_newline_is_kept() -> None:
    assert render("#!/bin/sh\necho {{ .Instance.ID }}\n") == "#!/bin/sh\necho web01jexample\n"


@pytest.mark.parametrize(
    ("source", "construct", "hint"),
    [
        ("{{ if .Vars.role }}x{{ end }}", "if", "{% if %}"),
        ("{{ range .Vars }}x{{ end }}", "range", "{% for %}"),
        ("{{ end }}", "end", "{% endif %} / {% endfor %}"),
        ("{{ with .Vars }}x{{ end }}", "with", "{% with %} or {% set %}"),
        ('{{ template "x" . }}', "template", "{% include %} or a macro"),
        ('{{ define "x" }}y{{ end }}', "define", "{% macro %}"),
        ("{{ .Vars.role | printf }}", "pipe", "a filter with parentheses, e.g. {{ x | default('y') }}"),
        ('{{ .Vars.role | printf "%q" }}', "pipe", "a filter with parentheses, e.g. {{ x | default('y') }}"),
        ('{{ printf "%s-x" .Vars.role }}', "printf", "an expression or filter, e.g. {{ '%s' | format(x) }}"),
        ("{{ len .Vars }}", "len", "an expression or filter, e.g. {{ '%s' | format(x) }}"),
        ("{{ $x := .Vars.role }}", "$variable", "{% set name = ... %}"),
        ("{{/* note */}}", "comment", "{# ... #}"),
        ("{{- /* note */ -}}", "comment", "{# ... #}"),
        ("{{ . }}", ".", "name the field, e.g. {{ Instance.ID }}"),
    ],
)
def test_go_constructs_are_refused_naming_template_and_construct(
    source: str, construct: str, hint: str
) -> None:
    assert failure(source) == (
        f'{NAME}: Go template construct "{construct}" is not supported; use Jinja2 syntax ({hint})'
    )


def test_undefined_names_are_errors_naming_the_path() -> None:
    assert failure("{{ .Vars.missing }}") == f'{NAME}: undefined variable "Vars.missing"'
    assert failure("{{ Foo }}") == f'{NAME}: undefined variable "Foo"'
    assert failure("{{ Foo.Bar }}") == f'{NAME}: undefined variable "Foo"'
    assert failure("{% if Nope %}x{% endif %}") == f'{NAME}: undefined variable "Nope"'
    assert failure("{{ .Instance.Id }}") == f'{NAME}: undefined variable "Instance.Id"'


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ Nonce.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{% set l = [1] %}{{ l.append(2) }}",
    ],
)
def test_sandbox_refuses_python_internals(source: str) -> None:
    assert failure(source).startswith(f"{NAME}: refused by the template sandbox:")


def test_namespace_internals_are_not_reachable() -> None:
    assert failure("{{ Vars._data }}") == f'{NAME}: undefined variable "Vars._data"'
    assert failure("{{ Vars.__class__ }}") == f'{NAME}: undefined variable "Vars.__class__"'


def test_syntax_and_runtime_errors_name_the_template() -> None:
    assert failure("line1\n{% if %}").startswith(f"{NAME}: syntax error on line 2:")
    assert failure("{{ 1 / 0 }}") == f"{NAME}: ZeroDivisionError: division by zero"


def test_render_args_renders_string_values_recursively() -> None:
    args = {
        "ImageId": "{{ .Image.debian }}",
        "Count": 2,
        "Enabled": True,
        "Tags": [{"Key": "{{ literal-key }}", "Value": "{{ Instance.ID }}"}],
        "Nested": {"Name": "n-{{ Vars.role }}", "None": None},
    }
    args["Tags"][0]["Key"] = "Name"
    rendered = render_args(args, DATA)
    assert rendered == {
        "ImageId": "ami-123",
        "Count": 2,
        "Enabled": True,
        "Tags": [{"Key": "Name", "Value": "web01jexample"}],
        "Nested": {"Name": "n-worker", "None": None},
    }
    assert args["ImageId"] == "{{ .Image.debian }}"
    assert render_args({"{{ key }}": "v"}, DATA) == {"{{ key }}": "v"}


def test_render_args_errors_name_the_arg_path() -> None:
    with pytest.raises(RenderError) as info:
        render_args({"Tags": [{"Value": "{{ Vars.nope }}"}]}, DATA, "templates.web.args")
    assert str(info.value) == 'templates.web.args.Tags[0].Value: undefined variable "Vars.nope"'


# ---- userdata decoding -----------------------------------------------------------------------

PLAIN = b"#!/bin/sh\necho hi\n"


def test_decode_userdata_encodings() -> None:
    assert decode_userdata(PLAIN, "plain") == PLAIN
    encoded = base64.encodebytes(PLAIN)
    assert b"\n" in encoded
    assert decode_userdata(encoded, "base64") == PLAIN
    assert decode_userdata(gzip.compress(PLAIN), "gzip") == PLAIN
    assert decode_userdata(base64.b64encode(gzip.compress(PLAIN)), "base64+gzip") == PLAIN


def test_decode_userdata_errors() -> None:
    with pytest.raises(InvalidArgument, match="not valid base64"):
        decode_userdata(b"@@@", "base64")
    with pytest.raises(InvalidArgument, match="not valid gzip"):
        decode_userdata(PLAIN, "gzip")
    with pytest.raises(InvalidArgument, match="truncated"):
        decode_userdata(gzip.compress(PLAIN)[:-8], "gzip")
    with pytest.raises(InvalidArgument, match="larger than 1000 bytes"):
        decode_userdata(gzip.compress(b"\0" * 100_000), "gzip", max_bytes=1000)
