"""Rendering templates with Go text/template semantics (missingkey=zero), and userdata decoding."""

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
from nstance.config.render import template_problem
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
        ("{{- .Vars.role -}}", "worker"),
        ("a {{- .Vars.role }}", "aworker"),
        ("a\n\t {{- .Vars.role -}} \n b", "aworkerb"),
        ("a {{-3}}", "a -3"),
        ("{{ .Instance.Kind }}/{{ .Instance.Arch }}/{{ .Instance.Type }}", "web/amd64/t.small"),
        ("{{ .Instance.Hostname }} {{ .Instance.FQDN }} {{ .Instance.IP4 }} {{ .Instance.IP6 }}",
         "web-1 web-1.example.com 10.0.0.5 fd00::5"),
        ("{{ .Cluster.ID }} {{ .Cluster.CACert }}", "c1 -----BEGIN CERTIFICATE-----"),
        ("{{ .Server.Shard }} {{ .Server.RegistrationAddr }} {{.Server.AgentAddr}} {{.Server.OperatorAddr}}",
         "s1 10.0.0.1:8992 10.0.0.1:8994 o:1"),
        ("{{ .Provider.Kind }} {{ .Provider.Region }} {{ .Provider.Zone }}", "aws us-east-1 us-east-1a"),
        ("{{ .Image.debian }} {{ .Nonce }}", "ami-123 jwt.token.here"),
        ("{{ .Vars.items }}", "shadowed-method-name"),
        # missingkey=zero: a missing map key is the empty string, in output and in conditions
        ("[{{ .Vars.missing }}]", "[]"),
        ("{{ if .Vars.missing }}set{{ else }}unset{{ end }}", "unset"),
        ('[{{ index .Vars "missing" }}]', "[]"),
        ('{{ index .Vars "role" }}', "worker"),
        # control structures
        ("{{ if .Vars.role }}yes{{ else }}no{{ end }}", "yes"),
        ('{{ if eq .Vars.role "x" }}x{{ else if eq .Vars.role "worker" }}w{{ else }}-{{ end }}', "w"),
        ("{{ with .Vars.role }}[{{ . }}]{{ end }}", "[worker]"),
        ("{{ with .Vars.nope }}[{{ . }}]{{ else }}none{{ end }}", "none"),
        ("{{ with $r := .Vars.role }}{{ $r }}{{ end }}", "worker"),
        ("{{ range $k, $v := .Vars }}{{ $k }}={{ $v }};{{ end }}", "items=shadowed-method-name;role=worker;"),
        ("{{ range .Vars }}{{ . }};{{ end }}", "shadowed-method-name;worker;"),
        ("{{ range 0 }}x{{ else }}empty{{ end }}", "empty"),
        ('{{ range $k, $v := .Vars }}{{ if eq $k "role" }}{{ break }}{{ end }}{{ $k }}{{ end }}', "items"),
        ('{{ range $k, $v := .Vars }}{{ if eq $k "items" }}{{ continue }}{{ end }}{{ $k }}{{ end }}', "role"),
        ("{{ $x := .Vars.role }}{{ $x }}{{ $x = \"other\" }}-{{ $x }}", "worker-other"),
        ("{{ $.Instance.ID }}", "web01jexample"),
        # functions
        ('{{ printf "%s-%d" .Vars.role 7 }}', "worker-7"),
        ('{{ .Vars.role | printf "%q" }}', '"worker"'),
        ('{{ printf "%05.1f|%x|%-4s|%t|%v" 3.14159 255 "ab" true 1.5 }}', "003.1|ff|ab  |true|1.5"),
        ('{{ printf "%d" "x" }}', "%!d(string=x)"),
        ("{{ len .Vars }} {{ len .Vars.role }}", "2 6"),
        ('{{ eq .Vars.role "a" "worker" }} {{ ne 1 2 }} {{ lt 1 2 }} {{ le 2 2 }}', "true true true true"),
        ('{{ gt "b" "a" }} {{ ge 1 2 }}', "true false"),
        ('{{ and .Vars.role "" }}|{{ or "" .Vars.role }}|{{ not .Vars.role }}', "|worker|false"),
        ("{{ and .Vars.nope (index .Vars.nope 5) }}", ""),
        ('{{ print 1 2 "a" 3 }} {{ println "x" 1 }}', "1 2a3 x 1\n"),
        ('{{ html "<a href=\'x\'>&</a>" }}', "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;"),
        ('{{ urlquery "a b&c" }}', "a+b%26c"),
        ('{{ slice "worker" 1 3 }}', "or"),
        ("{{ 'a' }} {{ 1.5 }} {{ 0x10 }} {{ 1e6 }} {{ true }} {{ `raw\\n` }}", "97 1.5 16 1e+06 true raw\\n"),
        ("{{ (index .Vars \"role\") }}{{ (.Instance).ID }}", "workerweb01jexample"),
        # comments and text outside actions
        ("a {{/* a comment */}} b", "a  b"),
        ("a \n{{- /* a comment */ -}}\n b", "ab"),
        ("echo ${#ARR[@]} ${VAR:-x} {% raw %} {# x #} }} {", None),
        ("no markup at all {", "no markup at all {"),
        ('{{ "}}" }}', "}}"),
    ],
)  # fmt: skip
def test_go_template_semantics(source: str, expected: str | None) -> None:
    assert render(source) == (source if expected is None else expected)


def test_trailing_newline_is_kept() -> None:
    assert render("#!/bin/sh\necho {{ .Instance.ID }}\n") == "#!/bin/sh\necho web01jexample\n"


@pytest.mark.parametrize(
    ("source", "construct"),
    [
        ('{{ template "x" . }}', "template"),
        ('{{ define "x" }}y{{ end }}', "define"),
        ('{{ block "x" . }}y{{ end }}', "block"),
        ("{{ call .Vars.role }}", "call"),
        ("{{ js .Vars.role }}", "js"),
        ("{{ .Vars.role | js }}", "js"),
    ],
)
def test_unsupported_constructs_are_errors_naming_them(source: str, construct: str) -> None:
    message = f'line 1: Go template construct "{construct}" is not supported'
    assert failure(source) == f"{NAME}: {message}"
    assert template_problem(source) == message


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ Instance.ID }}",
         'line 1: function "Instance" not defined (fields are written with a leading dot: .Instance)'),
        ("{{ upper .Vars.role }}", 'line 1: function "upper" not defined'),
        ("x\n{{ if .Vars.role }}", "unexpected EOF: {{if}} has no matching {{end}}"),
        ("{{ end }}", "line 1: unexpected {{end}}"),
        ("{{ else }}", "line 1: unexpected {{else}}"),
        ("{{ break }}", "line 1: {{break}} outside {{range}}"),
        ("{{ .Vars.role ", "line 1: unclosed action"),
        ("{{/* x */ }}", "line 1: comment ends before closing delimiter"),
        ('{{ "abc }}', "line 1: unterminated quoted string"),
        ("{{ }}", "line 1: missing value for command"),
    ],
)  # fmt: skip
def test_parse_errors_name_the_line(source: str, message: str) -> None:
    assert failure(source) == f"{NAME}: {message}"
    assert template_problem(source) == message


def test_unknown_struct_fields_are_errors_found_at_validation() -> None:
    message = "line 1: executing at <.Instance.Id>: can't evaluate field Id in type InstanceData"
    assert failure("{{ .Instance.Id }}") == f"{NAME}: {message}"
    assert template_problem("{{ .Instance.Id }}") == message
    assert template_problem("{{ .Foo }}") == (
        "line 1: executing at <.Foo>: can't evaluate field Foo in type TemplateData"
    )


def test_an_image_that_is_not_resolved_is_an_error_not_an_empty_id() -> None:
    # Go would render "" and let the provider fail; here the create stops with the image named
    # (nstance.server.reconcile.images adds why the lookup failed).
    assert (
        failure("{{ .Image.nope }}")
        == f'{NAME}: line 1: executing at <.Image.nope>: undefined variable "Image.nope"'
    )
    assert failure('{{ index .Image "nope" }}').endswith('undefined variable "Image.nope"')
    assert template_problem("{{ .Image.nope }}") is None  # resolved at run time, not a config error


def test_data_dependent_errors_are_found_when_rendering() -> None:
    assert template_problem("{{ slice .Vars.role 1 3 }}") is None
    assert failure("{{ slice .Vars.nope 1 3 }}") == (
        f"{NAME}: line 1: executing at <slice>: index out of range: 3"
    )
    assert failure("{{ lt .Vars.role 1 }}") == (
        f"{NAME}: line 1: executing at <lt>: lt: incompatible types for comparison"
    )
    assert failure("{{ .Vars.role.x }}") == (
        f"{NAME}: line 1: executing at <.Vars.role.x>: can't evaluate field x in type string"
    )


def test_upstream_file_template_vectors() -> None:
    """The string and env-value vectors of upstream's ``filegen/templates_test.go``."""
    data = TemplateData(
        instance=InstanceData(id="test-instance-123", kind="knc", arch="arm64", instance_type="t4g.medium",
                              hostname="test-host"),
        cluster=ClusterData(id="test-cluster-id", ca_cert="test-ca-cert"),
        server=ServerData(shard="us-west-2a-1", registration_addr="10.0.0.1:8992", agent_addr="10.0.0.1:8994",
                          operator_addr="10.0.0.1:8993"),
        provider=ProviderData(kind="aws", region="us-west-2", zone="us-west-2a"),
        image={"debian_13_arm64": "ami-test123"},
        vars={"Environment": "production", "KUBELET_NODE_LABELS": "controlplane",
              "ClusterFQDN": "test-cluster.example.com"},
    )  # fmt: skip
    source = '#!/bin/bash\necho "Instance {{ .Instance.ID }} starting"\nexport ENV={{ .Vars.Environment }}'
    assert render_template("t", source, data) == (
        '#!/bin/bash\necho "Instance test-instance-123 starting"\nexport ENV=production'
    )
    for source, expected in [
        ("{{ .Vars.KUBELET_NODE_LABELS }}", "controlplane"),
        ("{{ .Image.debian_13_arm64 }}", "ami-test123"),
        ("{{ .Server.AgentAddr }}", "10.0.0.1:8994"),
    ]:
        assert render_template("t", source, data) == expected


def test_render_args_renders_string_values_recursively() -> None:
    args = {
        "ImageId": "{{ .Image.debian }}",
        "Count": 2,
        "Enabled": True,
        "Tags": [{"Key": "{{ literal-key }}", "Value": "{{ .Instance.ID }}"}],
        "Nested": {"Name": "n-{{ .Vars.role }}", "None": None},
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
        render_args({"Tags": [{"Value": "{{ .Vars.nope.x }}"}]}, DATA, "templates.web.args")
    assert str(info.value) == (
        "templates.web.args.Tags[0].Value: line 1: executing at <.Vars.nope.x>: "
        "can't evaluate field x in type string"
    )


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
