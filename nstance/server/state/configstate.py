"""The shard's current configuration: ``config.jsonc`` + ``groups.jsonc``, a disk cache, change sets.

``ConfigState`` reads both documents from the shard-scoped object store, validates them with the
config loader, precomputes every group's merged config, and keeps the result as an immutable
``ConfigSnapshot``. Each ``load`` reports what changed as a ``ConfigChange`` (groups added or whose
merged config changed, groups removed), so the reconciler marks only those groups dirty.

Guarantees:

* a document that fails validation never replaces the current snapshot; the loader's error (with
  its JSON paths) is raised unchanged and kept in ``last_error``;
* when the ETags are unchanged, nothing is downloaded or parsed again (two HEAD requests per poll);
* every snapshot taken from storage is also written to ``{cache_dir}/shard-config.json`` (atomically,
  config and groups together), and when object storage is unreachable at start-up the server runs
  from that copy (``ConfigChange.source == "cache"``) until storage answers again;
* a ``groups.jsonc`` that is missing or blank after this server (or its disk cache) has seen a
  non-blank one is refused like an invalid document (``GroupsVanished``): an emptied or deleted file
  is far more often an accident than an intent, and taking it as "no dynamic groups" would delete
  every dynamic group's VMs. Writing ``{}`` removes every dynamic group on purpose;
* ``fault`` says why the last load failed (or that storage is unreachable and the snapshot is kept),
  as a bounded ``kind`` plus the message, for ``/health``, metrics and ``WatchErrors``;
* ``refresh`` (RefreshConfig) reports ``updated`` when the documents differ from those in force at
  the previous refresh, even if the periodic ETag check applied the change first.

Calls are synchronous and serialised by a lock (the server runs them with ``asyncio.to_thread``).
This module must not write to object storage (``dynamic_groups`` does that), touch SQLite or decide
what to do about a change.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from nstance.config.errors import ConfigError, Problem, join_path
from nstance.config.limits import groups_limit_problems
from nstance.config.loader import dump_groups_text, load_config_text, load_groups_text
from nstance.config.merge import MergedGroupConfig, all_group_keys, merged_group
from nstance.config.schema import DynamicGroups, ServerConfig
from nstance.core.atomicfile import write_atomic
from nstance.core.clock import Clock
from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound, NstanceError, Unavailable
from nstance.core.ids import GroupKey
from nstance.objectstore.base import ObjectInfo, ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

CONFIG_KEY = "config.jsonc"
GROUPS_KEY = "groups.jsonc"
CACHE_FILE = "shard-config.json"
_CACHE_VERSION = 1

Source = Literal["storage", "cache"]


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """One consistent pair of validated documents and every group's merged config.

    ``groups_etag`` is ``""`` when ``groups.jsonc`` does not exist. Treat the merged configs as
    read-only: they are shared by every reader of this snapshot.
    """

    config: ServerConfig
    dynamic: DynamicGroups
    config_etag: str
    groups_etag: str
    config_last_modified: datetime | None
    config_size: int
    source: Source
    loaded_at: datetime
    merged_groups: Mapping[GroupKey, MergedGroupConfig] = field(repr=False)

    def merged(self, tenant: str, group: str) -> MergedGroupConfig | None:
        """The effective config of ``tenant/group``, or None if no such group exists."""
        return self.merged_groups.get((tenant, group))

    def group_keys(self) -> list[GroupKey]:
        """Every (tenant, group), static or dynamic, sorted."""
        return sorted(self.merged_groups)


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """What one ``load`` or ``replace_dynamic`` did.

    ``updated`` is True when a snapshot with different ETags (or the first one) was installed;
    ``changed`` holds groups that were added or whose merged config changed (size included),
    ``removed`` groups that no longer exist. ``source`` says where the current documents were
    confirmed: ``"storage"``, or ``"cache"`` when object storage could not be reached.
    """

    changed: frozenset[GroupKey]
    removed: frozenset[GroupKey]
    prev_config_etag: str | None
    config_etag: str
    updated: bool
    source: Source
    prev_groups_etag: str | None = None
    groups_etag: str = ""


#: Bounded reasons a load failed (the ``kind`` label of ``nstance_degraded``).
FaultKind = Literal["missing", "empty", "invalid", "unavailable", "other"]


class GroupsVanished(FailedPrecondition):
    """``groups.jsonc`` is missing or blank although a non-blank one was seen before."""

    def __init__(self, message: str, kind: FaultKind) -> None:
        super().__init__(message)
        self.kind: FaultKind = kind


@dataclass(frozen=True, slots=True)
class ConfigFault:
    """Why the shard is not running on the documents now in object storage."""

    kind: FaultKind
    message: str


def fault_of(exc: BaseException) -> ConfigFault:
    """Classify a load error into a bounded kind, keeping its full message."""
    kind: FaultKind
    if isinstance(exc, GroupsVanished):
        kind = exc.kind
    elif isinstance(exc, NotFound):
        kind = "missing"
    elif isinstance(exc, InvalidArgument):
        kind = "invalid"
    elif isinstance(exc, Unavailable | OSError):
        kind = "unavailable"
    else:
        kind = "other"
    return ConfigFault(kind, str(exc))


@dataclass(frozen=True, slots=True)
class _Documents:
    """Raw documents as fetched (or as cached)."""

    config: bytes
    config_etag: str
    config_last_modified: datetime | None
    groups: bytes
    groups_etag: str


def _text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, [Problem("", f"the document is not UTF-8 text (byte {exc.start})")]
        ) from None


def _merge_all(
    config: ServerConfig, dynamic: DynamicGroups, groups_source: str
) -> dict[GroupKey, MergedGroupConfig]:
    """Every group's merged config; ConfigError if a dynamic group cannot be resolved."""
    merged: dict[GroupKey, MergedGroupConfig] = {}
    problems: list[Problem] = []
    for tenant, group in all_group_keys(config, dynamic):
        try:
            merged[(tenant, group)] = merged_group(config, dynamic, tenant, group)
        except (FailedPrecondition, NotFound) as exc:
            problems.append(Problem(join_path(tenant, group), str(exc)))
    if problems:
        raise ConfigError(groups_source, problems)
    return merged


def _touched(old: DynamicGroups, new: DynamicGroups) -> set[GroupKey]:
    """The (tenant, group)s whose dynamic entry differs between two documents.

    An edit copies only the tenant it touches and keeps every other entry object, so identity
    settles almost every comparison: an unchanged tenant is skipped whole.
    """
    touched: set[GroupKey] = set()
    for tenant in old.keys() | new.keys():
        old_groups, new_groups = old.get(tenant, {}), new.get(tenant, {})
        if old_groups is new_groups:
            continue
        for group in old_groups.keys() | new_groups.keys():
            before, after = old_groups.get(group), new_groups.get(group)
            if before is not after and before != after:
                touched.add((tenant, group))
    return touched


def _merge_changed(
    snap: ConfigSnapshot, dynamic: DynamicGroups, touched: set[GroupKey], groups_source: str
) -> dict[GroupKey, MergedGroupConfig]:
    """``_merge_all`` for a new dynamic document, re-merging only the ``touched`` groups."""
    merged = dict(snap.merged_groups)
    problems: list[Problem] = []
    for tenant, group in touched:
        static = snap.config.groups.get(tenant, {}).get(group)
        entry = dynamic.get(tenant, {}).get(group)
        if static is None and (entry is None or not entry.template):
            merged.pop((tenant, group), None)
            continue
        try:
            merged[(tenant, group)] = merged_group(snap.config, dynamic, tenant, group)
        except (FailedPrecondition, NotFound) as exc:
            problems.append(Problem(join_path(tenant, group), str(exc)))
    if problems:
        raise ConfigError(groups_source, problems)
    return merged


def _diff(
    old: Mapping[GroupKey, MergedGroupConfig],
    new: Mapping[GroupKey, MergedGroupConfig],
    keys: set[GroupKey] | None = None,
) -> tuple[frozenset[GroupKey], frozenset[GroupKey]]:
    """Groups added or changed, and groups removed; among ``keys`` only, when the caller knows them."""
    if keys is None:
        changed = frozenset(key for key, value in new.items() if old.get(key) != value)
        removed = frozenset(key for key in old if key not in new)
    else:
        changed = frozenset(key for key in keys if key in new and old.get(key) != new[key])
        removed = frozenset(key for key in keys if key in old and key not in new)
    return changed, removed


class ConfigState:
    """Holds the shard's current ``ConfigSnapshot`` and reloads it from object storage."""

    def __init__(self, store: ObjectStore, cache_dir: Path, *, clock: Clock) -> None:
        """``store`` is the shard-scoped store (keys ``config.jsonc``, ``groups.jsonc``)."""
        self._store = store
        self._cache_path = Path(cache_dir) / CACHE_FILE
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot: ConfigSnapshot | None = None
        self._config_text = ""
        self._failed: tuple[str, str, NstanceError] | None = None
        self._last_error: str | None = None
        self._fault: ConfigFault | None = None
        #: Whether a non-blank groups.jsonc was seen (None: not decided yet; the cache decides).
        self._groups_seen: bool | None = None
        #: (config, groups) ETags in force at the last refresh (or first load, or own groups write).
        self._confirmed: tuple[str, str] | None = None
        #: Documents of this server's last groups write whose disk-cache copy is still to be written.
        self._cache_due: _Documents | None = None
        prefix = getattr(store, "prefix", "")
        self._where = prefix if isinstance(prefix, str) else ""

    @property
    def cache_path(self) -> Path:
        """The file holding the last snapshot taken from storage."""
        return self._cache_path

    @property
    def last_error(self) -> str | None:
        """Why the last ``load`` failed (the error's full message), or None if it succeeded."""
        return self._last_error

    @property
    def fault(self) -> ConfigFault | None:
        """Why the last load did not confirm the documents in storage; None when it did."""
        return self._fault

    def snapshot(self) -> ConfigSnapshot | None:
        """The current snapshot, or None before the first successful load."""
        return self._snapshot

    def merged(self, tenant: str, group: str) -> MergedGroupConfig | None:
        """The effective config of ``tenant/group`` in the current snapshot, or None."""
        snap = self._snapshot
        return snap.merged(tenant, group) if snap is not None else None

    def group_keys(self) -> list[GroupKey]:
        """Every (tenant, group) of the current snapshot, sorted (empty before the first load)."""
        snap = self._snapshot
        return snap.group_keys() if snap is not None else []

    # -- loading -------------------------------------------------------------------------------

    def load(self, force: bool = False, *, require_storage: bool = False) -> ConfigChange:
        """Bring the snapshot up to date with object storage and report what changed.

        Without ``force``, unchanged ETags mean nothing is downloaded or parsed. Raises the loader's
        ConfigError (an InvalidArgument naming the document and JSON paths) when a document is invalid,
        NotFound when ``config.jsonc`` does not exist, and Unavailable when storage is unreachable
        and there is no usable cached copy - or, with ``require_storage`` (a server taking leadership,
        which must act on the dynamic groups as they are now), whenever storage is unreachable. After
        a failure the previous snapshot stays current.
        """
        with self._lock:
            return self._load_locked(force, require_storage)

    def refresh(self) -> ConfigChange:
        """``load(force=True)`` for RefreshConfig, compared with the documents of the previous refresh.

        ``updated`` (and the ``prev_*`` ETags) describe the change since the last refresh - or since
        this server's own last groups write - so a change the periodic ETag check applied first is
        still reported as a change, not as "unchanged".
        """
        with self._lock:
            confirmed = self._confirmed
            change = self._load_locked(True, False)
            current = (change.config_etag, change.groups_etag)
            self._confirmed = current
            if confirmed is None:
                return change
            return replace(
                change,
                updated=change.updated or confirmed != current,
                prev_config_etag=confirmed[0],
                prev_groups_etag=confirmed[1],
            )

    def _load_locked(self, force: bool, require_storage: bool) -> ConfigChange:
        try:
            change = self._load(force, require_storage)
        except Exception as exc:
            self._last_error = str(exc)
            self._fault = fault_of(exc)
            raise
        self._last_error = None
        if change.source == "cache" and self._fault is None:
            self._fault = ConfigFault(
                "unavailable", "object storage is unavailable; running on the cached config"
            )
        elif change.source == "storage":
            self._fault = None
        return change

    def _load(self, force: bool, require_storage: bool = False) -> ConfigChange:
        snap = self._snapshot
        try:
            docs = self._fetch(force)
        except Unavailable as exc:
            if require_storage:
                raise
            if snap is not None:
                # What we hold is at least as new as the cache (every install rewrites it).
                log.warning("object storage unavailable, keeping the current config: %s", exc)
                return self._unchanged(snap, "cache")
            docs = self._read_cache(exc)
            log.warning("object storage unavailable, running from the cached config: %s", exc)
            return self._install(docs, "cache", force=True)
        if docs is None:
            assert snap is not None  # _fetch returns None only when a snapshot matches
            if snap.source != "storage":
                snap = self._snapshot = replace(snap, source="storage")
            return self._unchanged(snap, "storage")
        return self._install(docs, "storage", force=force)

    def _fetch(self, force: bool) -> _Documents | None:
        """Both documents from storage, or None when their ETags match the current snapshot."""
        try:
            info = self._store.head(CONFIG_KEY)
        except ObjectNotFound:
            raise NotFound(
                f"{self._where}{CONFIG_KEY} does not exist in object storage; "
                "upload the shard's config.jsonc there"
            ) from None
        groups_info = self._head_groups()
        groups_etag = groups_info.etag if groups_info is not None else ""
        etags = (info.etag, groups_etag)
        snap = self._snapshot
        if not force and snap is not None and etags == (snap.config_etag, snap.groups_etag):
            return None
        if not force and self._failed is not None and etags == self._failed[:2]:
            raise self._failed[2]  # same broken documents as last time: no need to parse them again
        data, etag = self._store.get(CONFIG_KEY)
        try:
            groups, groups_etag = self._store.get(GROUPS_KEY)
        except ObjectNotFound:
            groups, groups_etag = b"", ""
        return _Documents(
            config=data,
            config_etag=etag,
            config_last_modified=info.last_modified if etag == info.etag else None,
            groups=groups,
            groups_etag=groups_etag,
        )

    def _head_groups(self) -> ObjectInfo | None:
        try:
            return self._store.head(GROUPS_KEY)
        except ObjectNotFound:
            return None

    def _install(self, docs: _Documents, source: Source, *, force: bool) -> ConfigChange:
        if source == "storage":
            config_source = f"{self._where}{CONFIG_KEY}"
            groups_source = f"{self._where}{GROUPS_KEY}"
        else:
            config_source = f"{self._cache_path} (cached {self._where}{CONFIG_KEY})"
            groups_source = f"{self._cache_path} (cached {self._where}{GROUPS_KEY})"
        try:
            self._check_groups_present(docs, groups_source)
            config_text = _text(docs.config, config_source)
            config = load_config_text(config_text, config_source)
            dynamic = load_groups_text(_text(docs.groups, groups_source), groups_source)
            problems = groups_limit_problems(config.shard.limits, config.groups, dynamic)
            if problems:
                raise ConfigError(groups_source, problems)
            merged = _merge_all(config, dynamic, groups_source)
        except (InvalidArgument, GroupsVanished) as exc:
            if source == "storage":
                self._failed = (docs.config_etag, docs.groups_etag, exc)
            raise
        self._failed = None
        if docs.groups.strip():
            self._groups_seen = True
        new = ConfigSnapshot(
            config=config,
            dynamic=dynamic,
            config_etag=docs.config_etag,
            groups_etag=docs.groups_etag,
            config_last_modified=docs.config_last_modified,
            config_size=len(docs.config),
            source=source,
            loaded_at=self._clock.now(),
            merged_groups=merged,
        )
        change = self._swap(new, config_text)
        if source == "storage" and (change.updated or force):
            self._write_cache(docs)
        return change

    def _check_groups_present(self, docs: _Documents, groups_source: str) -> None:
        """GroupsVanished if groups.jsonc is missing or blank after a non-blank one was seen."""
        if docs.groups.strip():
            return
        if self._groups_seen is None:
            self._groups_seen = self._cache_had_groups()
        if not self._groups_seen:
            return
        kind: FaultKind = "missing" if docs.groups_etag == "" else "empty"
        what = "does not exist" if kind == "missing" else f"is empty ({len(docs.groups)} bytes)"
        raise GroupsVanished(
            f"{groups_source} {what}, but it was non-empty before; keeping the last good dynamic groups "
            "and not acting on the change. Restore the document (the last good copy is in "
            f"{self._cache_path}), or write {{}} to it to remove every dynamic group on purpose",
            kind,
        )

    def _cache_had_groups(self) -> bool:
        """Whether the disk cache holds a non-blank groups.jsonc (an unreadable cache counts as no)."""
        try:
            document = json.loads(self._cache_path.read_bytes())
            return bool(str(document["groups"]["text"]).strip())
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def _swap(self, new: ConfigSnapshot, config_text: str, keys: set[GroupKey] | None = None) -> ConfigChange:
        old = self._snapshot
        if old is None:
            self._confirmed = (new.config_etag, new.groups_etag)
        changed, removed = _diff(old.merged_groups if old is not None else {}, new.merged_groups, keys)
        self._snapshot = new
        self._config_text = config_text
        return ConfigChange(
            changed=changed,
            removed=removed,
            prev_config_etag=old.config_etag if old is not None else None,
            config_etag=new.config_etag,
            updated=old is None or (old.config_etag, old.groups_etag) != (new.config_etag, new.groups_etag),
            source=new.source,
            prev_groups_etag=old.groups_etag if old is not None else None,
            groups_etag=new.groups_etag,
        )

    @staticmethod
    def _unchanged(snap: ConfigSnapshot, source: Source) -> ConfigChange:
        return ConfigChange(
            changed=frozenset(),
            removed=frozenset(),
            prev_config_etag=snap.config_etag,
            config_etag=snap.config_etag,
            updated=False,
            source=source,
            prev_groups_etag=snap.groups_etag,
            groups_etag=snap.groups_etag,
        )

    # -- dynamic groups written by this server -------------------------------------------------

    def replace_dynamic(
        self,
        dynamic: DynamicGroups,
        groups_etag: str,
        text: str | None = None,
        *,
        edited: tuple[DynamicGroups, set[GroupKey]] | None = None,
        defer_cache: bool = False,
    ) -> ConfigChange:
        """Install a ``groups.jsonc`` this server has just written (ETag ``groups_etag``), without re-reading.

        ``text`` is the document as written (serialised again when not given), for the disk cache.
        Only the groups whose entry changed are merged and compared, so the cost follows the edit,
        not the number of groups. ``edited`` is ``(base, keys)`` when the caller knows ``dynamic``
        is ``base`` with only ``keys`` edited: if ``base`` is the installed document, the entries
        are not compared at all (else they are, by identity first). With ``defer_cache`` the disk
        cache is written by the next ``flush_cache`` instead (the caller answers first).
        FailedPrecondition before the first load; ConfigError if a group would not resolve against
        the current config (the snapshot is then left as it was).
        """
        with self._lock:
            snap = self._snapshot
            if snap is None:
                raise FailedPrecondition(
                    "the shard config has not been loaded yet; load it before editing groups"
                )
            if edited is not None and edited[0] is snap.dynamic:
                touched = edited[1]
            else:
                touched = _touched(snap.dynamic, dynamic)
            merged = _merge_changed(snap, dynamic, touched, f"{self._where}{GROUPS_KEY}")
            new = replace(
                snap,
                dynamic=dynamic,
                groups_etag=groups_etag,
                loaded_at=self._clock.now(),
                merged_groups=merged,
            )
            change = self._swap(new, self._config_text, touched)
            self._groups_seen = True
            if self._confirmed is not None:  # our own write is not news to the next RefreshConfig
                self._confirmed = (self._confirmed[0], groups_etag)
            docs = _Documents(
                config=self._config_text.encode("utf-8"),
                config_etag=snap.config_etag,
                config_last_modified=snap.config_last_modified,
                groups=(text if text is not None else dump_groups_text(dynamic)).encode("utf-8"),
                groups_etag=groups_etag,
            )
            if defer_cache:
                self._cache_due = docs
            else:
                self._write_cache(docs)
            return change

    def flush_cache(self) -> None:
        """Write the disk cache a ``replace_dynamic(defer_cache=True)`` left to do (if still current)."""
        with self._lock:
            docs, self._cache_due = self._cache_due, None
            snap = self._snapshot
            if docs is not None and snap is not None and snap.groups_etag == docs.groups_etag:
                self._write_cache(docs)

    # -- disk cache ----------------------------------------------------------------------------

    def _write_cache(self, docs: _Documents) -> None:
        """Write the cache file; a failure is logged, never raised (storage stays the source of truth)."""
        modified = docs.config_last_modified
        document: dict[str, Any] = {
            "version": _CACHE_VERSION,
            "cached_at": self._clock.now().isoformat(),
            "config": {
                "key": f"{self._where}{CONFIG_KEY}",
                "etag": docs.config_etag,
                "last_modified": modified.isoformat() if modified is not None else None,
                "text": docs.config.decode("utf-8"),
            },
            "groups": {
                "key": f"{self._where}{GROUPS_KEY}",
                "etag": docs.groups_etag,
                "text": docs.groups.decode("utf-8"),
            },
        }
        data = json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
        try:
            write_atomic(self._cache_path, data, dir_mode=None)
        except OSError as exc:
            log.warning("could not write the config cache %s: %s", self._cache_path, exc)

    def _read_cache(self, cause: Unavailable) -> _Documents:
        """The cached documents; Unavailable (mentioning ``cause``) if there is no usable cache."""
        path = self._cache_path
        try:
            document = json.loads(path.read_bytes())
            config, groups = document["config"], document["groups"]
            modified = config.get("last_modified")
            return _Documents(
                config=str(config["text"]).encode("utf-8"),
                config_etag=str(config["etag"]),
                config_last_modified=datetime.fromisoformat(modified) if modified else None,
                groups=str(groups["text"]).encode("utf-8"),
                groups_etag=str(groups["etag"]),
            )
        except FileNotFoundError:
            reason = "there is no cached copy yet"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            reason = f"the cached copy is unreadable ({type(exc).__name__}: {exc})"
        raise Unavailable(
            f"cannot load the shard config: object storage is unavailable ({cause}) and {reason} at {path}"
        ) from cause
