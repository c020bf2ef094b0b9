"""Nstance's metadata on a Proxmox VM: association tags and the annotation block in the notes.

Association (spec/groups-and-instances.md) is in PVE tags, which ``/cluster/resources`` returns without a
config read: ``nstance`` (managed), ``nstance-cluster-<id>``, ``nstance-shard-<id>``, plus
``nstance-token-<hash>`` (a digest of the create's idempotency token, so a reused token is found in one
listing). Annotations (group, kind, created-at, and what get_instance reports back) are a marked block in
the VM's notes (``description``), visible in the PVE web UI; text the operator writes outside the block is
kept. The identifier is the VM name itself.

Pure string functions; no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

MANAGED_TAG = "nstance"
CLUSTER_TAG_PREFIX = "nstance-cluster-"
SHARD_TAG_PREFIX = "nstance-shard-"
TOKEN_TAG_PREFIX = "nstance-token-"

BLOCK_BEGIN = "<!-- nstance:begin (managed by Nstance; do not edit) -->"
BLOCK_END = "<!-- nstance:end -->"
_LINE = re.compile(r"^- ([a-z0-9][a-z0-9_.-]*): (.*)$")
_TAG_SPLIT = re.compile(r"[;,\s]+")


def association_tags(cluster_id: str, shard: str, token: str) -> list[str]:
    """The tags a managed VM carries, sorted as PVE stores them."""
    tags = [MANAGED_TAG, CLUSTER_TAG_PREFIX + cluster_id, SHARD_TAG_PREFIX + shard]
    if token:
        tags.append(token_tag(token))
    return sorted(tags)


def token_tag(token: str) -> str:
    """A tag-safe, fixed-length stand-in for an idempotency token."""
    return TOKEN_TAG_PREFIX + hashlib.sha256(token.encode("utf-8")).hexdigest()[:20]


def parse_tags(value: object) -> set[str]:
    """PVE's tag string (``a;b;c``; older releases also accept ``,`` and spaces) as a set."""
    if not isinstance(value, str):
        return set()
    return {t for t in _TAG_SPLIT.split(value.strip().lower()) if t}


def join_tags(tags: Iterable[str]) -> str:
    return ";".join(sorted(set(tags)))


def association_of(tags: set[str]) -> tuple[str, str] | None:
    """(cluster id, shard) of a managed VM's tags, or None when it is not Nstance's."""
    if MANAGED_TAG not in tags:
        return None
    cluster = [t[len(CLUSTER_TAG_PREFIX) :] for t in tags if t.startswith(CLUSTER_TAG_PREFIX)]
    shard = [t[len(SHARD_TAG_PREFIX) :] for t in tags if t.startswith(SHARD_TAG_PREFIX)]
    if len(cluster) != 1 or len(shard) != 1:
        return None
    return cluster[0], shard[0]


def render_notes(existing: str, annotations: Mapping[str, str]) -> str:
    """``existing`` with its Nstance block replaced by (or appended with) one holding ``annotations``."""
    outside = _strip_block(existing).rstrip("\n")
    lines = [BLOCK_BEGIN]
    for key in sorted(annotations):
        value = str(annotations[key]).replace("\r", " ").replace("\n", " ")
        if not _LINE.match(f"- {key}: {value}"):
            raise ValueError(f"annotation key {key!r} is not lowercase letters, digits, '.', '_' or '-'")
        lines.append(f"- {key}: {value}")
    lines.append(BLOCK_END)
    block = "\n".join(lines) + "\n"
    return f"{outside}\n\n{block}" if outside else block


def parse_notes(text: object) -> dict[str, str]:
    """The annotations of the Nstance block in ``text`` (empty when there is none)."""
    if not isinstance(text, str):
        return {}
    out: dict[str, str] = {}
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if line == BLOCK_BEGIN:
            inside, out = True, {}
            continue
        if line == BLOCK_END:
            if inside:
                return out
            continue
        if inside:
            match = _LINE.match(line)
            if match:
                out[match.group(1)] = match.group(2)
    return {}  # no complete block


def _strip_block(text: str) -> str:
    start = text.find(BLOCK_BEGIN)
    if start < 0:
        return text
    end = text.find(BLOCK_END, start)
    if end < 0:
        return text[:start]
    return text[:start] + text[end + len(BLOCK_END) :].lstrip("\n")
