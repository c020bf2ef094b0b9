"""A kubeconfig the operator cannot use is refused with one line naming the file and the reason.

kubernetes_asyncio answers every such file (missing, a directory, binary, broken YAML) with
"Expected key current-context", or leaks a YAML or Unicode exception; the operator checks the file
first (``kube.check_kubeconfig_files``, ``yamltext.read_yaml_mapping``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio.config import ConfigException
from typer.testing import CliRunner

from nstance.operator.cli import app as operator_app
from nstance.operator.kube import check_kubeconfig_files, kubeconfig_files, load_configuration
from nstance.operator.yamltext import YamlFileError, read_yaml_mapping, yaml_error_text

GOOD = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user: {token: abc}
"""


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "does not exist"),
        (b"\xff\xfe\x00x", "not UTF-8 text (byte 0)"),
        (b"clusters: [\n", "line 2, column 1: not valid YAML"),
        (b"", "must hold a YAML mapping (it is empty)"),
        (b"- a\n- b\n", "must hold a YAML mapping (it is a list)"),
    ],
)
def test_unusable_file_is_refused_with_its_reason(tmp_path: Path, content: bytes | None, reason: str) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigException) as checked:
        check_kubeconfig_files([path])
    with pytest.raises(ConfigException) as loaded:
        asyncio.run(load_configuration(str(path)))
    for message in (str(checked.value), str(loaded.value)):
        assert message.startswith(str(path)), message
        assert reason in message


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(YamlFileError, match=r": cannot read: Is a directory"):
        read_yaml_mapping(tmp_path)


def test_a_list_skips_missing_files_but_needs_one(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text(GOOD)
    missing = tmp_path / "missing"
    files = kubeconfig_files(f"{missing}{os.pathsep}{good}")
    assert files == [missing, good]
    check_kubeconfig_files(files)  # kubectl skips a missing file of a list
    configuration = asyncio.run(load_configuration(f"{missing}{os.pathsep}{good}"))
    assert configuration.host == "https://127.0.0.1:6443"
    with pytest.raises(ConfigException, match=r"none of .* exists"):
        check_kubeconfig_files(kubeconfig_files(f"{missing}{os.pathsep}{tmp_path / 'other'}"))


def test_no_name_means_the_home_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kubeconfig_files(None) == [tmp_path / ".kube" / "config"]
    assert kubeconfig_files("") == [tmp_path / ".kube" / "config"]


def test_yaml_error_text_counts_from_one() -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        yaml.safe_load("a: b\nc: [d\n")
    assert yaml_error_text(caught.value).startswith("line 3, column 1: not valid YAML: ")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"users: {a: [\n", "line 2, column 1: not valid YAML"),
        (b"\xff\x00", "not UTF-8 text (byte 0)"),
    ],
)
def test_the_program_says_one_line_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, expected: str
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    result = CliRunner().invoke(
        operator_app,
        ["--kubeconfig", str(path), "--disable-webhooks"],
    )
    lines = [line for line in result.output.splitlines() if line.startswith("nstance-operator:")]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    assert f"cannot load the Kubernetes credentials (--kubeconfig {path}): {path}" in lines[0]
    assert expected in lines[0]
    assert "Traceback" not in result.output
