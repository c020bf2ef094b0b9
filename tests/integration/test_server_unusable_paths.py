"""A ``--cachedir`` or ``--bucket`` the server cannot use is named in one line with exit 1.

A file with the cache directory's name ended in the last-resort ``unexpected error: FileExistsError``
line; a bucket name the S3 client refuses before any request was retried for ever as "object storage
is unavailable", logged with its first words twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nstance.core.errors import InvalidArgument
from nstance.server.app import prepare_cachedir


def server(*flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSTANCE_", "AWS_"))}
    return subprocess.run(
        [sys.executable, "-m", "nstance.server", "--id", "s1", "--shard", "a", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    in_the_way = tmp_path / "cache"
    in_the_way.write_text("not a directory")
    result = server("--storage", "file", "--bucket", str(bucket), "--cachedir", str(in_the_way))
    lines = [line for line in result.stderr.splitlines() if line.startswith("nstance-server:")]
    assert result.returncode == 1, result.stderr
    assert lines == [
        f"nstance-server: --cachedir {in_the_way}: is not a directory; the server keeps its cache there"
    ]
    assert "Traceback" not in result.stderr


def test_a_missing_directory_is_created_and_an_impossible_one_named(tmp_path: Path) -> None:
    prepare_cachedir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgument, match=r"--cachedir .*/file/sub: Not a directory"):
        prepare_cachedir(tmp_path / "file" / "sub")


def test_a_bucket_name_no_request_can_carry_is_named(tmp_path: Path) -> None:
    result = server("--storage", "s3", "--bucket", "my bucket!", "--cachedir", str(tmp_path / "cache"))
    lines = [line for line in result.stderr.splitlines() if line.startswith("nstance-server:")]
    assert result.returncode == 1, result.stderr
    assert lines == [
        "nstance-server: --bucket 'my bucket!' is not a bucket name (letters, digits, '.', '-' and '_' only)"
    ]
