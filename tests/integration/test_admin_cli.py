"""nstance-admin as a user runs it: cluster init / nonce / config validate / upload on file:// storage,
and every console script answering --help."""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from typer.testing import CliRunner

from nstance.admin.cli import app
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.pki.nonce import verify_nonce
from nstance.secrets.cluster_identity import load_cluster_identity
from nstance.secrets.objectstorage import ObjectStorageSecretStore

ROOT = Path(__file__).resolve().parents[2]
KEY = bytes(range(32))
KEY_B64 = base64.b64encode(KEY).decode()


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _store_flags(bucket: Path) -> list[str]:
    return ["--storage-provider", "file", "--storage-bucket", str(bucket)]


def _invoke(runner: CliRunner, args: list[str], key: str | None = KEY_B64) -> tuple[int, str, str]:
    env = {"NSTANCE_ENCRYPTION_KEY": key} if key is not None else {"NSTANCE_ENCRYPTION_KEY": ""}
    result = runner.invoke(app, args, env=env)
    return result.exit_code, result.stdout, result.stderr


def _identity(bucket: Path):  # type: ignore[no-untyped-def]
    cluster = ScopedObjectStore(FileObjectStore(bucket), "cluster/")
    return load_cluster_identity(cluster, ObjectStorageSecretStore(cluster, "secret/", keys=[KEY]))


def test_init_then_refuse_then_exist_ok(runner: CliRunner, tmp_path: Path) -> None:
    bucket = tmp_path / "store"
    code, out, _ = _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])
    assert code == 0, out
    assert "created the CA" in out
    assert (bucket / "cluster" / "ca.crt").is_file()
    secret = (bucket / "cluster" / "secret" / "ca.key").read_bytes()
    assert b"PRIVATE KEY" not in secret  # encrypted at rest
    fingerprint = _identity(bucket).ca_fingerprint

    code, _, err = _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])
    assert code == 1
    assert "already initialised" in err
    assert fingerprint in err
    code, out, _ = _invoke(
        runner, ["cluster", "init", "--cluster-id", "demo", "--exist-ok", *_store_flags(bucket)]
    )
    assert code == 0
    assert fingerprint in out
    assert _identity(bucket).ca_fingerprint == fingerprint


@pytest.mark.parametrize(
    ("where", "reason"), [("file", "is not a directory"), ("file/below", "Not a directory")]
)
def test_init_names_a_storage_directory_it_cannot_make(
    runner: CliRunner, tmp_path: Path, where: str, reason: str
) -> None:
    # a file in the way ended in "unexpected error: FileExistsError" / "NotADirectoryError"
    (tmp_path / "file").write_text("not a directory")
    bucket = tmp_path / where
    code, _, err = _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])
    assert code == 1, err
    assert f"storage directory {bucket}: {reason}" in err
    assert "unexpected error" not in err


def test_init_without_key_writes_nothing(runner: CliRunner, tmp_path: Path) -> None:
    bucket = tmp_path / "store"
    code, _, err = _invoke(
        runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)], key=None
    )
    assert code == 1
    assert "NSTANCE_ENCRYPTION_KEY" in err
    assert not any(p.is_file() for p in bucket.rglob("*")) if bucket.exists() else True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster-id", "Demo"], "--cluster-id 'Demo'"),
        (["--cluster-id", "demo", "--ca-key-type", "rsa"], "--ca-key-type 'rsa'"),
        (["--cluster-id", "demo", "--storage-provider", "azure"], "--storage-provider 'azure'"),
        (["--cluster-id", "demo", "--secrets-provider", "vault"], "unknown secrets provider 'vault'"),
    ],
)
def test_init_bad_flags_are_named(runner: CliRunner, tmp_path: Path, args: list[str], message: str) -> None:
    flags = ["--storage-bucket", str(tmp_path / "s")]
    if "--storage-provider" not in args:
        flags += ["--storage-provider", "file"]
    code, _, err = _invoke(runner, ["cluster", "init", *args, *flags])
    assert code == 1
    assert message in err
    assert not (tmp_path / "s" / "cluster").exists()


def test_nonce_verifies_with_the_cluster_key(runner: CliRunner, tmp_path: Path) -> None:
    bucket = tmp_path / "store"
    assert _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])[0] == 0
    out_file = tmp_path / "id" / "nonce.jwt"
    code, _out, err = _invoke(
        runner,
        ["cluster", "nonce", "--cluster-id", "demo", "--tenant", "team-a", "--expiry", "90m",
         "--output", str(out_file), *_store_flags(bucket)],
    )  # fmt: skip
    assert code == 0, err
    assert stat.S_IMODE(out_file.stat().st_mode) == 0o600
    token = out_file.read_text().strip()
    public = _identity(bucket).nonce_key.public_key()
    assert isinstance(public, Ed25519PublicKey)
    claims = verify_nonce(token, public, expected_kind="operator", cluster_id="demo")
    assert claims.tenant == "team-a"
    assert (claims.exp - claims.iat).total_seconds() == 90 * 60


def test_nonce_default_output_and_stdout(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = tmp_path / "store"
    monkeypatch.chdir(tmp_path)
    assert _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])[0] == 0
    code, _, _ = _invoke(runner, ["cluster", "nonce", "--cluster-id", "demo", *_store_flags(bucket)])
    assert code == 0
    # as upstream's admin writes it: missing directories 0700, the file 0600 with the token alone
    nonce = tmp_path / "temp" / "cli-operator-identity" / "nonce.jwt"
    for directory in (nonce.parent.parent, nonce.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(nonce.stat().st_mode) == 0o600
    token = nonce.read_text()
    assert token.count(".") == 2
    assert token == token.strip()  # no final newline
    code, out, _ = _invoke(
        runner, ["cluster", "nonce", "--cluster-id", "demo", "-o", "-", *_store_flags(bucket)]
    )
    assert code == 0
    assert out.endswith("\n")  # on stdout a line, as upstream's fmt.Println
    header = json.loads(base64.urlsafe_b64decode(out.split(".")[0] + "=="))
    assert header["alg"] == "EdDSA"


def test_nonce_output_that_cannot_be_written_is_named(runner: CliRunner, tmp_path: Path) -> None:
    # a directory, or a path below a file, ended in "unexpected error: IsADirectoryError" and the like
    bucket = tmp_path / "store"
    assert _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])[0] == 0
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    cases = [
        (["-o", str(tmp_path / "dir")], f"--output {tmp_path / 'dir'} is a directory"),
        (["-o", str(tmp_path / "file" / "n")], f"cannot write the nonce to {tmp_path / 'file' / 'n'}: Not a"),
    ]
    for extra, message in cases:
        code, _, err = _invoke(
            runner, ["cluster", "nonce", "--cluster-id", "demo", *extra, *_store_flags(bucket)]
        )
        assert code == 1, err
        assert message in err
        assert "unexpected error" not in err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".nstance-tmp")]  # no temporary file left
    assert list((tmp_path / "dir").iterdir()) == []


def test_cluster_and_root_options_work_on_their_group_and_after_cluster_commands(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # upstream declares the storage and secrets flags persistent on `cluster`, and --temp-dir and
    # --debug/-v on the root (cobra): accepted there and after any command below
    bucket = str(tmp_path / "store")
    provider = ["--storage-provider", "file"]
    code, _, err = _invoke(
        runner, ["cluster", *provider, "--storage-bucket", bucket, "init", "--cluster-id", "x"]
    )
    assert code == 0, err
    nonce = ["nonce", "--cluster-id", "x"]
    code, out, err = _invoke(
        runner, ["cluster", *provider, *nonce, "--storage-bucket", bucket, "--output", "-"]
    )
    assert code == 0, err
    assert out.count(".") == 2

    debug: list[object] = []
    monkeypatch.setattr("logging.basicConfig", lambda **kwargs: debug.append(kwargs.get("level")))
    t1 = tmp_path / "t1"
    code, _, err = _invoke(
        runner, ["cluster", *nonce, *_store_flags(tmp_path / "store"), "--temp-dir", str(t1), "-v"]
    )
    assert code == 0, err
    assert (t1 / "cli-operator-identity" / "nonce.jwt").is_file()
    assert debug == [logging.DEBUG]

    temps = ["--temp-dir", str(tmp_path / "t2"), "cluster", "--temp-dir", str(tmp_path / "t3")]
    code, _, err = _invoke(runner, [*temps, "register-operator", *_store_flags(tmp_path / "store")])
    assert code == 0, err
    assert not (tmp_path / "t2").exists()  # the later --temp-dir wins
    assert (tmp_path / "t3" / "cli-operator-identity" / "identity.crt").is_file()

    # --version stays an option of nstance-admin itself, as upstream's local flag
    code, _, err = _invoke(runner, ["cluster", "--version"])
    assert code == 2
    assert "No such option" in err


def test_nonce_refuses_uninitialised_cluster_and_wrong_key(runner: CliRunner, tmp_path: Path) -> None:
    bucket = tmp_path / "store"
    code, _, err = _invoke(
        runner, ["cluster", "nonce", "--cluster-id", "demo", "-o", "-", *_store_flags(bucket)]
    )
    assert code == 1
    assert "cluster init" in err
    assert _invoke(runner, ["cluster", "init", "--cluster-id", "demo", *_store_flags(bucket)])[0] == 0
    other = base64.b64encode(bytes(32)).decode()
    code, out, err = _invoke(
        runner, ["cluster", "nonce", "--cluster-id", "demo", "-o", "-", *_store_flags(bucket)], key=other
    )
    assert code == 1
    assert out == ""
    assert "could not be decrypted" in err
    code, _, err = _invoke(
        runner,
        ["cluster", "nonce", "--cluster-id", "demo", "--expiry", "0s", "-o", "-", *_store_flags(bucket)],
    )
    assert code == 1
    assert "--expiry" in err


def test_config_validate_reports_every_problem(runner: CliRunner, tmp_path: Path) -> None:
    good = ROOT / "examples" / "local" / "config.jsonc"
    code, out, _ = _invoke(runner, ["config", "validate", str(good)])
    assert code == 0
    assert out.strip().endswith("OK")
    bad = tmp_path / "bad.jsonc"
    bad.write_text('{"cluster": {"id": "Bad_Id"}, "templates": {"knc": {"kind": "KN"}},}')
    code, _, err = _invoke(runner, ["config", "validate", str(good), str(bad)])
    assert code == 1
    assert "templates.knc.kind" in err
    assert "cluster.id" in err
    assert "Traceback" not in err


def test_config_upload_validates_first(runner: CliRunner, tmp_path: Path) -> None:
    bucket = tmp_path / "store"
    bad = tmp_path / "bad.jsonc"
    bad.write_text("{ not json")
    code, _, err = _invoke(
        runner, ["config", "upload", str(bad), "--shard", "local-a", *_store_flags(bucket)]
    )
    assert code == 1
    assert "nothing was uploaded" in err
    assert not (bucket / "shard").exists()
    good = ROOT / "examples" / "local" / "config.jsonc"
    # A bucket directory that does not exist is a typo until `cluster init` has made it.
    code, _, err = _invoke(
        runner, ["config", "upload", str(good), "--shard", "local-a", *_store_flags(bucket)]
    )
    assert code == 1
    assert f"storage directory {bucket} does not exist" in err
    assert not bucket.exists()
    bucket.mkdir()
    code, out, _ = _invoke(
        runner, ["config", "upload", str(good), "--shard", "local-a", *_store_flags(bucket)]
    )
    assert code == 0, out
    assert (bucket / "shard" / "local-a" / "config.jsonc").read_bytes() == good.read_bytes()


@pytest.mark.parametrize("script", ["nstance-server", "nstance-agent", "nstance-operator", "nstance-admin"])
def test_every_console_script_answers_help(script: str) -> None:
    exe = Path(sys.executable).with_name(script)
    result = subprocess.run(
        [str(exe), "--help"], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout
