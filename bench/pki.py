"""Benchmark: the PKI hot paths against the raw signature primitives they are built on.

Measured, each against a baseline measured in the same run with the same key:

* ``nonce_sign_verify`` — ``sign_nonce`` + ``verify_nonce`` of an agent registration nonce (PyJWT
  EdDSA, header and claim checks). Baseline: raw Ed25519 ``sign`` + ``verify`` of the very bytes the
  JWT signs (``header.payload``). The ratio is the price of JSON, base64url and the checks.
* ``client_cert_issue`` — ``issue_client_certificate`` of an ECDSA P-256 agent certificate by the
  default (ECDSA P-256) CA, the key already generated. Baseline: one raw ECDSA P-256 / SHA-256
  signature with the CA key over a payload the size of that certificate's to-be-signed part. The
  ratio is the price of building and encoding the certificate around its one signature.

Measured and baseline batches alternate and the median batch rate is reported, because machines
here are noisy. Prints one JSON object per line:
``{"name", "value", "unit": "ops/s", "baseline", "baseline_name", "ratio"}``. Runs about 3 s in all,
touches no files or network.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from nstance.core.clock import SystemClock
from nstance.pki import ca as ca_mod
from nstance.pki import certs, keys, nonce

SECONDS_PER_PAIR = 1.5
BATCH_SECONDS = 0.05


def _batch_size(fn: Callable[[], object]) -> int:
    """How many calls of ``fn`` take roughly BATCH_SECONDS (after a warm-up)."""
    for _ in range(3):
        fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= BATCH_SECONDS / 4 or n >= 1 << 16:
            elapsed = max(time.perf_counter() - t0, 1e-9)
            return max(1, int(n * BATCH_SECONDS / elapsed))
        n *= 2


def _rate(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def compare(
    name: str, fn: Callable[[], object], baseline_name: str, baseline: Callable[[], object]
) -> dict[str, object]:
    """Alternate batches of ``fn`` and ``baseline`` for about SECONDS_PER_PAIR; medians of the rates."""
    n_fn, n_base = _batch_size(fn), _batch_size(baseline)
    rates: list[float] = []
    base_rates: list[float] = []
    deadline = time.monotonic() + SECONDS_PER_PAIR
    while len(rates) < 3 or time.monotonic() < deadline:
        rates.append(_rate(fn, n_fn))
        base_rates.append(_rate(baseline, n_base))
    value, base = statistics.median(rates), statistics.median(base_rates)
    return {
        "name": name,
        "value": round(value, 1),
        "unit": "ops/s",
        "baseline": round(base, 1),
        "baseline_name": baseline_name,
        "ratio": round(value / base, 4),
    }


def bench_nonce() -> dict[str, object]:
    key = ed25519.Ed25519PrivateKey.generate()
    pub = key.public_key()
    clock = SystemClock()
    claims = nonce.agent_nonce_claims(
        instance_id="knc06bgm7733st2576nx5jht4ecjw",
        cluster_id="prod",
        shard="us-east-1a",
        group="workers",
        tenant="acme",
        config_hash="9f86d081884c7d659a2feaa0c55ad015",
        clock=clock,
    )
    token = nonce.sign_nonce(key, claims)
    signing_input = token.rsplit(".", 1)[0].encode()

    def measured() -> None:
        t = nonce.sign_nonce(key, claims)
        nonce.verify_nonce(t, pub, expected_kind="agent", cluster_id="prod", shard="us-east-1a", clock=clock)

    def baseline() -> None:
        pub.verify(key.sign(signing_input), signing_input)

    return compare("nonce_sign_verify", measured, "ed25519_sign_verify_raw", baseline)


def bench_client_cert() -> dict[str, object]:
    authority = ca_mod.create_ca(cluster_id="prod")  # default: ECDSA P-256
    ca_key = authority.private_key
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    client_pub = keys.generate_private_key("ecdsa-p256").public_key()
    clock = SystemClock()

    def measured() -> certs.IssuedCertificate:
        return certs.issue_client_certificate(
            authority, client_pub, client_id="knc06bgm7733st2576nx5jht4ecjw", tenant="acme", role="agent",
            clock=clock,
        )  # fmt: skip

    sample = measured()
    payload = bytes(len(sample.certificate.tbs_certificate_bytes))
    algorithm = ec.ECDSA(hashes.SHA256())

    def baseline() -> None:
        ca_key.sign(payload, algorithm)

    return compare("client_cert_issue", measured, "ecdsa_p256_sign_raw", baseline)


def main() -> int:
    for bench in (bench_nonce, bench_client_cert):
        print(json.dumps(bench()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
