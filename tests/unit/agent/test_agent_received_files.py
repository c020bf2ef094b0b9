"""Files pushed by the server: name and content validation, staging, commit writes and config.hash."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nstance.agent.files import Delivery, FileReceiver, validate_file_content, validate_file_name
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.pki.ca import create_ca
from nstance.pki.certs import issue_server_certificate
from nstance.pki.keys import generate_private_key, private_key_to_pem, public_key_to_pem


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/abs",
        "/etc/passwd",
        "a/../../b",
        "a/..",
        "..",
        "a\x00b",
        "a\\b",
        "",
        "a//b",
        "a/",
        "./a",
        "a/./b",
    ],
)
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_file_name(name)


@pytest.mark.parametrize("name", ["ca.crt", "kubelet/kubelet.crt", "a/b/c.env", "..hidden", "x..y"])
def test_clean_relative_names_are_accepted(name: str) -> None:
    assert validate_file_name(name) == name


def _cert_pem() -> bytes:
    return issue_server_certificate(create_ca(clock=ManualClock(datetime.now(UTC)))).cert_pem


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("a.crt", b"not a cert"),
        ("a.crt", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
        ("a.key", public_key_to_pem(generate_private_key())),
        ("a.key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
        ("a.pub", private_key_to_pem(generate_private_key())),
        ("a.json", b"{not json"),
        ("a.env", b"FOO=1\nlower=2\n"),
        ("a.env", b"NO_EQUALS\n"),
    ],
)
def test_bad_content_is_refused_by_extension(name: str, content: bytes) -> None:
    with pytest.raises(InvalidArgument, match=name):
        validate_file_content(name, content)


def test_good_content_passes() -> None:
    key = generate_private_key()
    validate_file_content("ca.crt", _cert_pem() + _cert_pem())
    validate_file_content("k.key", private_key_to_pem(key))
    validate_file_content("k.pub", public_key_to_pem(key))
    validate_file_content("x.json", b'{"a": [1, 2]}')
    validate_file_content("x.env", b"# comment\n\nFOO_1=bar baz\nEMPTY=\n")
    validate_file_content("anything.conf", b"\x00\xff raw bytes are fine")


def make_receiver(tmp_path: Path) -> tuple[FileReceiver, Path, Path, list[str]]:
    recv = tmp_path / "recv"
    hash_path = tmp_path / "identity" / "config.hash"
    commits: list[str] = []
    return FileReceiver(recv, hash_path, on_commit=commits.append), recv, hash_path, commits


def test_files_are_written_only_on_commit_then_config_hash(tmp_path: Path) -> None:
    receiver, recv, hash_path, commits = make_receiver(tmp_path)
    when = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
    receiver.receive(Delivery("etc/app.json", b'{"v": 2}', last_modified=when))
    receiver.receive(Delivery("app.env", b"A=1\n"))
    assert not recv.exists() or list(recv.rglob("*")) == []
    assert not hash_path.exists()

    result = receiver.receive(Delivery("", config_hash="abc123"))

    assert result is not None
    assert result.written == ["app.env", "etc/app.json"]
    assert json.loads((recv / "etc" / "app.json").read_text()) == {"v": 2}
    assert stat.S_IMODE((recv / "etc" / "app.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((recv / "etc").stat().st_mode) == 0o750
    assert (recv / "etc" / "app.json").stat().st_mtime == when.timestamp()
    assert hash_path.read_text().strip() == "abc123"
    assert commits == ["abc123"]
    assert receiver.staged == []
    statuses = receiver.statuses()
    assert statuses["etc/app.json"].last_modified == when
    assert statuses["app.env"].last_modified is not None
    assert not [p for p in recv.rglob("*") if p.name.startswith(".nstance-tmp-")]


def test_refused_files_are_not_written_and_their_error_is_reported(tmp_path: Path) -> None:
    receiver, recv, _hash_path, _ = make_receiver(tmp_path)
    receiver.receive(Delivery("../outside.txt", b"x"))
    receiver.receive(Delivery("bad.json", b"{"))
    receiver.receive(Delivery("good.txt", b"ok"))
    receiver.commit("h")

    assert not (tmp_path / "outside.txt").exists()
    assert not (recv / "bad.json").exists()
    assert (recv / "good.txt").read_bytes() == b"ok"
    statuses = receiver.statuses()
    assert "'..'" in (statuses["../outside.txt"].error or "")
    assert "not valid JSON" in (statuses["bad.json"].error or "")
    assert statuses["good.txt"].error is None

    # a later valid delivery of the same name clears the error
    receiver.receive(Delivery("bad.json", b"[]"))
    receiver.commit("h2")
    assert receiver.statuses()["bad.json"].last_modified is not None


def test_a_symlink_cannot_lead_a_file_outside(tmp_path: Path) -> None:
    receiver, recv, _, _ = make_receiver(tmp_path)
    recv.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, recv / "link")
    receiver.receive(Delivery("link/x.txt", b"x"))
    receiver.commit("h")
    assert not (outside / "x.txt").exists()
    assert "outside the receive directory" in (receiver.statuses()["link/x.txt"].error or "")


def test_a_failed_write_leaves_config_hash_unchanged(tmp_path: Path) -> None:
    receiver, recv, hash_path, commits = make_receiver(tmp_path)
    recv.mkdir()
    (recv / "blocker").write_text("a file where a directory is needed")
    receiver.receive(Delivery("blocker/x.txt", b"x"))
    result = receiver.commit("h")
    assert "blocker/x.txt" in result.failed
    assert not result.config_hash_written
    assert not hash_path.exists()
    assert commits == []
    assert receiver.statuses()["blocker/x.txt"].error


def test_files_already_in_the_directory_are_reported(tmp_path: Path) -> None:
    receiver, recv, _, _ = make_receiver(tmp_path)
    (recv / "sub").mkdir(parents=True)
    (recv / "sub" / "old.txt").write_text("from a previous run")
    assert set(receiver.statuses()) == {"sub/old.txt"}


def test_every_applied_commit_ends_with_the_completion_marker_upstreams_agent_writes(tmp_path: Path) -> None:
    # Upstream's agent writes RECV_DIR/write-files.last (Unix milliseconds) after the files and
    # config.hash of a patch; watchers on the machine apply received files when it changes.
    receiver, recv, hash_path, _ = make_receiver(tmp_path)
    marker = recv / "write-files.last"
    before = int(datetime.now(UTC).timestamp() * 1000)
    receiver.receive(Delivery("app.env", b"A=1\n"))
    receiver.commit("h1")
    assert hash_path.read_bytes() == b"h1"  # the hash alone, as upstream's agent writes it
    first = int(marker.read_text())
    assert before <= first <= int(datetime.now(UTC).timestamp() * 1000)
    assert marker.stat().st_mtime_ns >= hash_path.stat().st_mtime_ns >= (recv / "app.env").stat().st_mtime_ns
    assert "write-files.last" not in receiver.statuses()  # the agent's own file, not a pushed one

    receiver.receive(Delivery("", config_hash="h2"))  # a commit without files is applied too
    assert hash_path.read_text().strip() == "h2"
    assert int(marker.read_text()) >= first

    recv.joinpath("blocker").write_text("a file where a directory is needed")
    stamp = marker.read_text()
    receiver.receive(Delivery("blocker/x.txt", b"x"))
    assert not receiver.commit("h3").config_hash_written
    assert marker.read_text() == stamp  # a commit that was not applied leaves the marker alone

    receiver.receive(Delivery("write-files.last", b"0"))  # no pushed file may take its name
    assert "completion marker" in (receiver.statuses()["write-files.last"].error or "")
    assert marker.read_text() == stamp


def test_files_from_a_go_server_without_commits_are_applied_one_by_one(tmp_path: Path) -> None:
    # Go servers before the commit message (upstream's older internal/server/agent) send every file
    # with the group's runtime hash and never a commit; their agent wrote each file and the hash at once.
    receiver, recv, hash_path, commits = make_receiver(tmp_path)
    result = receiver.receive(Delivery("app.env", b"A=1", config_hash="sha256:old-server"))
    assert result is not None
    assert result.written == ["app.env"]
    assert (recv / "app.env").read_bytes() == b"A=1"
    assert hash_path.read_bytes() == b"sha256:old-server"
    receiver.receive(Delivery("bad.json", b"{", config_hash="sha256:old-server"))
    assert "not valid JSON" in (receiver.statuses()["bad.json"].error or "")
    assert not (recv / "bad.json").exists()
    assert commits == ["sha256:old-server", "sha256:old-server"]
    assert (recv / "write-files.last").is_file()
