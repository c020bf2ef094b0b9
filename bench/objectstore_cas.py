"""Benchmark: compare-and-swap updates on the file:// object store vs a plain atomic file write.

Measured: one read-ETag -> ``put_if_match`` update of a single key (what a leader renewing its lease
or a groups.jsonc edit does) on ``FileObjectStore``. Baseline, measured in the same run, directory and
payload size: writing a temporary file, fsyncing it and ``os.replace``-ing it over the target, the
cheapest durable atomic write there is. The ratio is the price of conditional semantics across
processes (flock, read + MD5 compare, directory fsync). The two are run in alternating batches and the
median batch is reported, because machines here are noisy.

Prints one JSON object per line. It must not leave files behind (a temporary directory is used unless
``--dir`` is given, and it is removed) and must finish in about 20 s.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nstance.objectstore.file import FileObjectStore

PAYLOAD_BYTES = 2048
BATCH = 40
MAX_BATCHES = 30
TIME_BUDGET_S = 12.0


def _payload(i: int) -> bytes:
    stamp = f"{i:012d}".encode()
    return stamp + b"x" * (PAYLOAD_BYTES - len(stamp))


def _atomic_write(directory: Path, target: Path, data: bytes) -> None:
    tmp = directory / f".bench-tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)


def _time_cas(store: FileObjectStore, key: str, start: int, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + n):
        _, etag = store.get(key)
        store.put_if_match(key, _payload(i), etag)
    return (time.perf_counter() - t0) / n


def _time_baseline(directory: Path, target: Path, start: int, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + n):
        _atomic_write(directory, target, _payload(i))
    return (time.perf_counter() - t0) / n


def run(work_dir: Path) -> dict[str, object]:
    store = FileObjectStore(work_dir / "store")
    key = "shard/bench/leader.json"
    store.put(key, _payload(0))
    baseline_dir = work_dir / "store" / "shard" / "bench"  # same directory, same file system
    baseline_target = baseline_dir / "baseline.json"
    _time_cas(store, key, 1, 5)  # warm up both paths
    _time_baseline(baseline_dir, baseline_target, 1, 5)

    cas: list[float] = []
    base: list[float] = []
    deadline = time.monotonic() + TIME_BUDGET_S
    counter = 10
    while len(cas) < MAX_BATCHES and (len(cas) < 3 or time.monotonic() < deadline):
        cas.append(_time_cas(store, key, counter, BATCH))
        base.append(_time_baseline(baseline_dir, baseline_target, counter, BATCH))
        counter += BATCH
    value = statistics.median(cas)
    baseline = statistics.median(base)
    return {
        "name": "file_put_if_match",
        "value": value,
        "unit": "s/op",
        "baseline": baseline,
        "baseline_name": "atomic file write (temp+fsync+rename)",
        "ratio": value / baseline,
        "iterations": len(cas) * BATCH,
        "payload_bytes": PAYLOAD_BYTES,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, help="directory to benchmark in (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            result = run(Path(tmp))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(Path(tmp))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
