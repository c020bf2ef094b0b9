"""Identifier rules and puidv7 instance IDs as users and other implementations see them."""

from __future__ import annotations

import random
import threading
import uuid

import pytest

from nstance.core import ids
from nstance.core.errors import InvalidArgument

KNOWN_ID = "knc06bgm7733st2576nx5jht4ecjw"
KNOWN_UUID = uuid.UUID("01970a1c-e31e-7422-9cd5-e9651d11cc97")


@pytest.mark.parametrize("value", ["a", "default", "us-east-1a", "a1-b2-c3", "x" * 32, "0"])
def test_valid_identifiers(value: str) -> None:
    assert ids.identifier_problem(value) is None
    assert ids.validate_identifier(value) == value


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "must not be empty"),
        ("x" * 33, "at most 32 characters (got 33)"),
        ("Upper", "lowercase letters"),
        ("has_underscore", "lowercase letters"),
        ("-lead", "must start and end"),
        ("trail-", "must start and end"),
        ("double--dash", "must not contain '--'"),
    ],
)
def test_invalid_identifier_says_which_rule(value: str, rule: str) -> None:
    problem = ids.identifier_problem(value)
    assert problem is not None
    assert rule in problem
    with pytest.raises(InvalidArgument, match="group"):
        ids.validate_identifier(value, "group")


def test_known_pair_from_the_go_implementation() -> None:
    parsed = ids.parse_puid(KNOWN_ID)
    assert parsed.kind == "knc"
    assert parsed.uuid == KNOWN_UUID
    assert str(parsed) == KNOWN_ID
    assert str(ids.puid_from_uuid("knc", KNOWN_UUID)) == KNOWN_ID
    assert parsed.storage_key == "01970a1c-e31e-7422-9cd5-e9651d11cc97-knc"
    assert ids.parse_storage_key(parsed.storage_key) == parsed


def test_new_ids_have_the_documented_shape() -> None:
    value = ids.new_instance_id("tst")
    assert len(value) == 29
    assert value.startswith("tst")
    assert value == value.lower()
    parsed = ids.parse_puid(value)
    assert parsed.uuid.version == 7
    assert parsed.uuid.variant == uuid.RFC_4122


def test_ids_sort_by_creation_time_even_within_one_millisecond() -> None:
    frozen_ms = 1_750_000_000_000
    generator = ids.PuidGenerator(now_ms=lambda: frozen_ms)
    made = [str(generator.new("abc")) for _ in range(5000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    # counter overflow moves the embedded time forward instead of breaking order
    assert ids.parse_puid(made[-1]).timestamp_ms >= frozen_ms


def test_ids_are_unique_and_ordered_under_concurrency() -> None:
    generator = ids.PuidGenerator()
    results: list[list[str]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(slot: int) -> None:
        barrier.wait()
        results[slot].extend(str(generator.new("con")) for _ in range(2000))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [value for chunk in results for value in chunk]
    assert len(set(everything)) == len(everything) == 16000
    for chunk in results:  # each thread sees strictly increasing ids
        assert chunk == sorted(chunk)


def test_storage_keys_sort_like_creation_order() -> None:
    generator = ids.PuidGenerator()
    made = [generator.new("knd") for _ in range(100)]
    assert [p.storage_key for p in made] == sorted(p.storage_key for p in made)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("knc06bgm7733st2576nx5jht4ecj", "must be 29 characters"),
        ("KN106bgm7733st2576nx5jht4ecjw", "prefix must be exactly 3 lowercase letters"),
        ("knc06bgm7733st2576nx5jht4ecj!", "invalid base32 character"),
        ("knc06bgm7733st2576nx5jht4ecjx", "trailing pad bits"),
        ("knc" + "0" * 26, "not a UUIDv7"),
    ],
)
def test_bad_instance_ids_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ids.parse_puid(text)


def test_bad_kind_refused() -> None:
    with pytest.raises(InvalidArgument, match="exactly 3 lowercase letters"):
        ids.new_puid("k1")


def _reference_decode(text: str) -> int:
    """The value of a Crockford base32 body read one 5-bit digit at a time, as the format describes it."""
    value = 0
    for char in text:
        value = value << 5 | "0123456789abcdefghjkmnpqrstvwxyz".index(char)
    return value >> 2


def test_ids_decode_as_the_digit_by_digit_definition_does() -> None:
    rng = random.Random(20261127)
    values = [0, 1, (1 << 128) - 1, KNOWN_UUID.int] + [rng.getrandbits(128) for _ in range(2000)]
    look_alikes = 0
    for value in values:
        text = str(ids.Puid("abc", uuid.UUID(int=value)))[3:]
        assert ids._decode(text) == _reference_decode(text) == value
        # Look-alike letters are read as the digits they resemble (parse_puid lowercases first).
        if "0" in text and "1" in text:
            look_alikes += 1
            for zero, one in (("o", "i"), ("o", "l")):
                assert ids._decode(text.replace("0", zero).replace("1", one)) == value
    assert look_alikes > 100
    assert ids.parse_puid("knc" + KNOWN_ID[3:].upper().replace("0", "O")) == ids.parse_puid(KNOWN_ID)


@pytest.mark.parametrize(
    "bad",
    [
        "u",  # a base32hex digit, but no Crockford one
        " ",
        "_",
        "+",
        "-",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: a digit to int(), not to this format
        "\u0130",  # lowercases to two characters
        "é",
    ],
)
def test_characters_outside_crockford_base32_are_refused_wherever_they_stand(bad: str) -> None:
    for at in (3, 15, 28):
        text = KNOWN_ID[:at] + bad + KNOWN_ID[at + 1 :]
        with pytest.raises(InvalidArgument, match="invalid base32 character"):
            ids.parse_puid(text)


def test_a_storage_key_worked_out_from_the_text_is_the_parsed_ids() -> None:
    generator = ids.PuidGenerator()
    for puid in [ids.parse_puid(KNOWN_ID)] + [generator.new("vmx") for _ in range(500)]:
        assert ids.storage_key_of(str(puid)) == puid.storage_key
    refusals = [("knc" + "0" * 26, "not a UUIDv7 \\(version None\\)"), ("knc06bgm", "29 characters")]
    for text, message in refusals:
        with pytest.raises(InvalidArgument, match=message):
            ids.storage_key_of(text)


def test_validating_an_id_refuses_what_parsing_refuses() -> None:
    assert ids.validate_puid(KNOWN_ID) == KNOWN_ID
    for text in ("knc" + "0" * 26, "knc06bgm7733st2576nx5jht4ecju", "KNC06bgm7733st2576nx5jht4ecjw", ""):
        with pytest.raises(InvalidArgument) as parsing:
            ids.parse_puid(text)
        with pytest.raises(InvalidArgument) as validating:
            ids.validate_puid(text)
        assert str(validating.value) == str(parsing.value)
