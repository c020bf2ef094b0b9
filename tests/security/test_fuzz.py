"""Property-based fuzzing of the parsers that take untrusted input (hypothesis, modest example counts).

* Config (``nstance.config``): for arbitrary text, text mutations of valid documents (JSONC with
  comments, and JSON), and any value placed anywhere in a valid document, the loaders raise nothing
  but ``ConfigError`` and ``validate_config_text`` raises nothing at all; every problem has a
  message and a well-formed JSON path (``templates.web.files["a.crt"].kind``, ``groups.x[0]``).
* Registration nonces (``nstance.pki.nonce.verify_nonce``): arbitrary strings and bytes, every
  mutation of a genuine token, arbitrary JSON signed with the right key, and time claims anywhere in
  (and just beyond) the range of dates raise nothing but ``Unauthenticated``.
* Instance ids and identifiers (``nstance.core.ids``): parsing raises nothing but InvalidArgument,
  valid ids round-trip, and the identifier and kind rules are exactly their documented patterns.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nstance.config import ConfigError, Problem, load_config_text, load_groups_text, validate_config_text
from nstance.config.jsonc import parse_jsonc
from nstance.core import ids
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument, Unauthenticated
from nstance.pki import nonce
from nstance.testing.jwtforge import b64json, b64url, ed_sign, split
from nstance.testing.shardproc import ADDR_NAMES, shard_config

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEWER = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- config ------------------------------------------------------------------------------------------

_KEY = r'(?:[A-Za-z0-9_-]+|\["(?:[^"\\]|\\.)*"\])'
JSON_PATH = re.compile(rf"{_KEY}(?:\.[A-Za-z0-9_-]+|\[\d+\]|\[\"(?:[^\"\\]|\\.)*\"\])*", re.DOTALL)
LOCAL_EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "local" / "config.jsonc").read_text()


def valid_config() -> dict[str, Any]:
    """A small valid config.jsonc document (fixed addresses, so examples replay exactly)."""
    return shard_config(addrs={name: f"127.0.0.1:{9000 + i}" for i, name in enumerate(ADDR_NAMES)})


def assert_well_formed(problems: list[Problem]) -> None:
    for problem in problems:
        assert isinstance(problem, Problem)
        assert problem.message, problem
        assert problem.path == "" or JSON_PATH.fullmatch(problem.path), problem.path


def check_config_text(text: str) -> None:
    """Validation never raises; loading raises ConfigError only, with the same well-formed problems."""
    problems = validate_config_text(text)
    assert_well_formed(problems)
    if problems:
        with pytest.raises(ConfigError) as info:
            load_config_text(text)
        assert info.value.problems == problems
    else:
        load_config_text(text)


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        load_config_text(text)
    check_config_text(text)
    with contextlib.suppress(ConfigError):
        load_groups_text(text)


@FUZZ
@given(st.text(max_size=200))
def test_jsonc_syntax_errors_name_a_line_and_column_inside_the_text(text: str) -> None:
    try:
        parse_jsonc(text)
    except ConfigError as exc:
        [problem] = exc.problems
        match = re.match(r"line (\d+), column (\d+): ", problem.message)
        if match is not None:
            line, column = int(match[1]), int(match[2])
            lines = text.split("\n")
            assert 1 <= line <= len(lines)
            assert 1 <= column <= len(lines[line - 1]) + 1


mutation = st.tuples(
    st.sampled_from(["delete", "insert", "replace"]),
    st.floats(min_value=0, max_value=1),
    st.integers(min_value=1, max_value=8),
    st.text(alphabet='{}[]":,/*\n \\0123abc-_.étrue', max_size=8),
)


def mutate(text: str, edits: list[tuple[str, float, int, str]]) -> str:
    for kind, where, length, insert in edits:
        at = int(where * len(text))
        if kind == "delete":
            text = text[:at] + text[at + length :]
        elif kind == "insert":
            text = text[:at] + insert + text[at:]
        else:
            text = text[:at] + insert + text[at + len(insert) :]
    return text


@FEWER
@given(st.sampled_from(["jsonc example", "json"]), st.lists(mutation, min_size=1, max_size=4))
def test_mutated_valid_documents_give_problems_with_paths(
    base: str, edits: list[tuple[str, float, int, str]]
) -> None:
    text = LOCAL_EXAMPLE if base == "jsonc example" else json.dumps(valid_config(), indent=2)
    check_config_text(mutate(text, edits))


#: Keys include plain words followed by a newline: a path must quote them, not print them bare.
_keys = st.text(max_size=6) | st.from_regex(r"[a-z_]{1,5}\n", fullmatch=True)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    return out


_BASE_PATHS = _paths(valid_config())[1:]


@FUZZ
@given(st.sampled_from(_BASE_PATHS), _json)
def test_any_value_anywhere_in_a_valid_config_raises_only_config_error(
    path: tuple[Any, ...], value: Any
) -> None:
    doc = valid_config()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        text = json.dumps(doc)
    except ValueError:
        return
    try:
        load_config_text(text)
    except ConfigError as exc:
        found = exc.problems
    else:
        return
    assert found
    assert all(p.message and "pydantic" not in p.message for p in found)
    assert_well_formed(found)
    assert {p.path.split(".")[0].split("[")[0] for p in found} <= {"", *doc}


# --- registration nonces -------------------------------------------------------------------------------

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
KEY = ed25519.Ed25519PrivateKey.generate()
PUB = KEY.public_key()
GENUINE = nonce.sign_nonce(
    KEY,
    nonce.agent_nonce_claims(
        instance_id="knc06bgm7733st2576nx5jht4ecjw",
        cluster_id="prod",
        shard="us-east-1a",
        group="workers",
        tenant="acme",
        clock=ManualClock(START),
    ),
)
FIRST_DATE, LAST_DATE = -62135596800, 253402300799  # 0001-01-01 and 9999-12-31T23:59:59, in seconds


def verify(token: str | bytes) -> nonce.NonceClaims:
    return nonce.verify_nonce(
        token, PUB, expected_kind="agent", cluster_id="prod", shard="us-east-1a", clock=ManualClock(START)
    )


def test_the_genuine_token_verifies() -> None:
    assert verify(GENUINE).sub == "knc06bgm7733st2576nx5jht4ecjw"


def test_a_signature_spelled_with_other_unused_bits_is_unauthenticated() -> None:
    # Found by the mutation fuzz below: the signature's last base64url character carries 4 bits the
    # decoder drops, so 15 other characters decode to the same 64 bytes, and the altered token verified.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(GENUINE[-1])
    twins = [c for i, c in enumerate(alphabet) if i >> 4 == last >> 4 and i != last]
    assert len(twins) == 15
    for twin in twins:
        altered = GENUINE[:-1] + twin
        assert base64.urlsafe_b64decode(altered.rsplit(".", 1)[1] + "==") == base64.urlsafe_b64decode(
            GENUINE.rsplit(".", 1)[1] + "=="
        )
        with pytest.raises(Unauthenticated):
            verify(altered)


@FUZZ
@given(st.one_of(st.text(), st.binary(), st.from_regex(r"[A-Za-z0-9_\-]{0,60}(\.[A-Za-z0-9_\-]{0,60}){2}")))
def test_arbitrary_input_raises_only_unauthenticated(token: str | bytes) -> None:
    with pytest.raises(Unauthenticated):
        nonce.verify_nonce(token, PUB, expected_kind="agent", cluster_id="prod", clock=ManualClock(START))


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["delete", "insert", "replace"]),
            st.floats(min_value=0, max_value=1),
            st.integers(min_value=1, max_value=4),
            st.text(alphabet="AQgw_-.=+/ eyJ0", min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_every_mutation_of_a_genuine_token_is_unauthenticated(
    edits: list[tuple[str, float, int, str]],
) -> None:
    mutated = mutate(GENUINE, edits)
    if mutated == GENUINE:
        return
    with pytest.raises(Unauthenticated):
        verify(mutated)


@FEWER
@given(
    header=st.dictionaries(
        st.text(max_size=8), st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    ),
    payload=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=10,
    ),
)
def test_arbitrary_json_signed_with_the_right_key_raises_only_unauthenticated(
    header: Any, payload: Any
) -> None:
    header = {**header, "alg": "EdDSA"}
    signing_input = f"{b64json(header)}.{b64json(payload)}"
    token = f"{signing_input}.{b64url(KEY.sign(signing_input.encode()))}"
    with pytest.raises(Unauthenticated):
        nonce.verify_nonce(token, PUB, expected_kind="agent", cluster_id="prod", clock=ManualClock(START))


_time = st.one_of(
    st.integers(min_value=FIRST_DATE - 10, max_value=LAST_DATE + 10),
    st.sampled_from([FIRST_DATE, LAST_DATE, LAST_DATE - 30, FIRST_DATE + 30, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
)


@FUZZ
@given(exp=_time, nbf=_time, iat=_time)
def test_time_claims_anywhere_in_the_calendar_raise_only_unauthenticated(
    exp: Any, nbf: Any, iat: Any
) -> None:
    payload = {**split(GENUINE)[1], "exp": exp, "nbf": nbf, "iat": iat}  # NaN and Infinity included
    token = ed_sign({"alg": "EdDSA", "typ": "JWT"}, payload, KEY)
    with contextlib.suppress(Unauthenticated):
        verify(token)


# --- instance ids and identifiers -----------------------------------------------------------------------

IDENTIFIER = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


@FUZZ
@given(st.text(max_size=40))
def test_parsing_any_text_fails_only_with_invalid_argument(text: str) -> None:
    try:
        parsed = ids.parse_puid(text)
    except InvalidArgument:
        return
    assert ids.parse_puid(str(parsed)) == parsed


@FUZZ
@given(st.text(max_size=60))
def test_parsing_any_storage_key_fails_only_with_invalid_argument(text: str) -> None:
    with contextlib.suppress(InvalidArgument):
        ids.parse_storage_key(text)


@FUZZ
@given(st.uuids(version=4), st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=3))
def test_round_trip_any_v7_uuid(seed: uuid.UUID, kind: str) -> None:
    as_v7 = uuid.UUID(int=(seed.int & ~(0xF << 76)) | (0x7 << 76))
    puid = ids.puid_from_uuid(kind, as_v7)
    assert ids.parse_puid(str(puid)) == puid
    assert ids.parse_storage_key(puid.storage_key) == puid


@FUZZ
@given(st.one_of(st.text(max_size=40), st.from_regex(IDENTIFIER, fullmatch=True).map(lambda s: s + "\n")))
def test_the_identifier_rule_is_exactly_the_documented_pattern(value: str) -> None:
    documented = (
        bool(IDENTIFIER.fullmatch(value)) and "--" not in value and len(value) <= ids.IDENTIFIER_MAX_LEN
    )
    assert (ids.identifier_problem(value) is None) == documented, repr(value)
    assert (ids.kind_problem(value) is None) == bool(re.fullmatch(r"[a-z]{3}", value)), repr(value)
