"""Compare-and-swap editing of ``groups.jsonc`` (the shard's dynamic groups) in object storage.

``edit_dynamic_groups`` reads the document and its ETag, applies a pure edit function, and writes the
result only if nobody else wrote in between (If-Match; If-None-Match when the document does not exist
yet). When it loses that race it re-reads and runs the edit again on the fresh document, so
concurrent editors (two servers of a shard during a handover, or concurrent API calls) never lose
each other's updates. Unlike upstream, which gives up on the first conflict, it retries a few times.
When the caller knew an existing document and the re-read finds it deleted or blank, the edit is
refused (``GroupsVanished``) instead of writing a document holding only this edit: that would turn an
accidental deletion into the loss of every other dynamic group.

This module must not decide what an edit means (``nstance.config.editing`` does) nor update the
in-memory snapshot (the caller hands the result to ``ConfigState.replace_dynamic``). Synchronous:
the server runs it with ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable

from nstance.config.loader import dump_groups_text, load_groups_text
from nstance.config.schema import DynamicGroups
from nstance.core.errors import InvalidArgument, Unavailable
from nstance.core.ids import GroupKey, groups_by_tenant
from nstance.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from nstance.server.state.configstate import GroupsVanished

GROUPS_KEY = "groups.jsonc"
EDIT_ATTEMPTS = 5


def read_dynamic_groups(store: ObjectStore, *, must_exist: bool = False) -> tuple[DynamicGroups, str | None]:
    """``(groups, etag)`` from the shard-scoped ``store``; ``({}, None)`` if the document does not exist.

    Raises the loader's ConfigError (InvalidArgument) if the stored document is invalid, and with
    ``must_exist`` GroupsVanished if it is missing or blank.
    """
    source = f"{getattr(store, 'prefix', '')}{GROUPS_KEY}"
    try:
        data, etag = store.get(GROUPS_KEY)
    except ObjectNotFound:
        if must_exist:
            raise GroupsVanished(
                f"{source} was deleted; refusing to write a new one holding only this change "
                "(restore it, or write {} to it to start from no dynamic groups)",
                "missing",
            ) from None
        return {}, None
    if must_exist and not data.strip():
        raise GroupsVanished(
            f"{source} is empty ({len(data)} bytes); refusing to overwrite it with only this change "
            "(restore it, or write {} to it to start from no dynamic groups)",
            "empty",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{source}: the document is not UTF-8 text (byte {exc.start})") from None
    return load_groups_text(text, source), etag


def edit_dynamic_groups(
    store: ObjectStore,
    edit: Callable[[DynamicGroups], DynamicGroups],
    *,
    attempts: int = EDIT_ATTEMPTS,
    known: tuple[DynamicGroups, str | None] | None = None,
    dump: Callable[[DynamicGroups], str] = dump_groups_text,
    edited: Callable[[], tuple[DynamicGroups, set[GroupKey]] | None] = lambda: None,
) -> tuple[DynamicGroups, str]:
    """Apply ``edit`` to the stored dynamic groups atomically; return the groups written and their ETag.

    ``edit`` must be pure (it may run several times, each time on freshly read data) and may raise to
    refuse the change, in which case nothing is written and its error propagates. An edit that changes
    nothing writes nothing. Raises Unavailable
    when ``attempts`` writes in a row lost to concurrent writers.

    ``known`` is a ``(groups, etag)`` the caller believes current (the server's loaded snapshot): the
    first attempt starts from it without reading, and the conditional write catches a stale guess.
    ``dump`` serialises the document (``GroupsText.dump`` gives the same text at the cost of the
    changed entries only). ``edited`` says, after an ``edit``, ``(base, keys)`` when the edit started
    from ``base`` and changed at most the groups ``keys``: only those are compared to tell whether
    anything changed.
    """
    for attempt in range(max(1, attempts)):
        if attempt == 0 and known is not None and known[1] is not None:
            current, etag = known
        else:
            current, etag = read_dynamic_groups(store, must_exist=known is not None and known[1] is not None)
        updated = edit(current)
        if etag is not None and _unchanged(current, updated, edited()):
            return current, etag  # nothing to change: no write, the ETag stays valid
        data = dump(updated).encode("utf-8")
        try:
            new_etag = store.put_if_match(GROUPS_KEY, data, etag)
        except PreconditionFailed:
            continue
        return updated, new_etag
    raise Unavailable(f"{GROUPS_KEY} kept changing under us; retry")


def _unchanged(
    current: DynamicGroups, updated: DynamicGroups, hint: tuple[DynamicGroups, set[GroupKey]] | None
) -> bool:
    """``updated == current``; with a ``hint`` from ``current``, comparing only the groups it names.

    A tenant's mapping that is the same object is the same; in another one only the named groups can
    differ (the edits said so), so equal sizes and equal named entries mean an equal mapping. With
    10,000 groups in a tenant the full comparison was most of a millisecond on every write.
    """
    if hint is None or hint[0] is not current:
        return updated == current
    names = groups_by_tenant(hint[1])
    if updated.keys() != current.keys():
        return False
    for tenant, groups in updated.items():
        before = current[tenant]
        if groups is before:
            continue
        if tenant not in names:
            if groups != before:
                return False
        elif len(groups) != len(before) or any(groups.get(g) != before.get(g) for g in names[tenant]):
            return False
    return True
