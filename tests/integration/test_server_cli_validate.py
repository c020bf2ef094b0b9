"""``nstance-server --validate``: a file, or (bare flag, as upstream) the shard's documents in storage;
and ``--prefix`` as upstream means it (the shard scope, default ``shard/{shard}/``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nstance.objectstore.factory import open_scopes
from nstance.server import cli
from nstance.server.app import ServerApp, ServerOptions
from nstance.testing.shardproc import server_addrs, shard_config

RUNNER = CliRunner()


def _run(*args: str) -> tuple[int, str]:
    result = RUNNER.invoke(cli.app, cli._with_remote_validate(list(args)))
    return result.exit_code, result.output


@pytest.fixture
def bucket(tmp_path: Path) -> Path:
    root = tmp_path / "bucket"
    scopes = open_scopes("file", str(root), shard="zone-a")
    config = shard_config(cluster_id="demo", shard="zone-a", addrs=server_addrs())
    scopes.shard.put("config.jsonc", json.dumps(config).encode())
    return root


def test_bare_validate_checks_the_shards_remote_config_and_groups(bucket: Path) -> None:
    code, out = _run("--validate", "--shard", "zone-a", "--storage", "file", "--bucket", str(bucket))
    assert (code, out.strip()) == (0, f"file://{bucket}/shard/zone-a/: OK")
    scopes = open_scopes("file", str(bucket), shard="zone-a")
    scopes.shard.put("groups.jsonc", b'{"default": {"orphan": {"template": "nope", "size": 1}}}')
    code, out = _run("--shard", "zone-a", "--storage", "file", "--bucket", str(bucket), "--validate")
    assert code == 1
    assert "groups.jsonc: default.orphan: " in out
    assert 'template "nope" is not defined' in out


def test_bare_validate_names_a_missing_config_and_needs_a_shard(bucket: Path) -> None:
    code, out = _run("--validate", "--shard", "zone-b", "--storage", "file", "--bucket", str(bucket))
    assert code == 1
    assert "shard/zone-b/config.jsonc: does not exist in object storage" in out
    code, out = _run("--validate", "--storage", "file", "--bucket", str(bucket))
    assert code == cli.EXIT_USAGE
    assert "--validate without a file needs --shard and --bucket" in out


def test_validate_with_a_file(tmp_path: Path) -> None:
    path = tmp_path / "config.jsonc"
    path.write_text('{"cluster": {}}')
    code, out = _run("--validate", str(path))
    assert code == 1
    assert f"{path}: cluster.id: is required" in out


def test_prefix_is_the_shard_scope_as_upstream(tmp_path: Path) -> None:
    def scopes(prefix: str) -> tuple[str, str]:
        app = ServerApp(
            ServerOptions(
                server_id="s1",
                shard="zone-a",
                storage="file",
                bucket=str(tmp_path),
                cachedir=tmp_path,
                prefix=prefix,
            )
        )
        made = app._scopes()
        return made.shard.prefix, made.cluster.prefix  # type: ignore[attr-defined]

    assert scopes("") == ("shard/zone-a/", "cluster/")
    assert scopes("shards/{shard}") == ("shards/zone-a/", "cluster/")
    assert scopes("custom/") == ("custom/", "cluster/")
