"""``nstance-server --validate``: check a config file, or the shard's own documents in object storage.

With a file, the file is validated as ``config validate`` does. Without one (upstream's
``--validate`` with no value), the shard's ``config.jsonc`` and ``groups.jsonc`` are read from the
shard scope the other flags name (``--storage``, ``--bucket``, ``--prefix``, ``--shard``) and checked
the way the server loads them: the config by the loader, then every group merged with its
``groups.jsonc`` entry. Returns the problems as lines; reads only, never writes.
"""

from __future__ import annotations

from nstance.config.errors import ConfigError
from nstance.config.loader import load_config_text, load_groups_text
from nstance.config.merge import all_group_keys, merged_group
from nstance.core.errors import FailedPrecondition, NotFound
from nstance.objectstore.base import ObjectNotFound, ObjectStore
from nstance.server.state.configstate import CONFIG_KEY, GROUPS_KEY


def _text(store: ObjectStore, key: str) -> str | None:
    try:
        data, _etag = store.get(key)
    except ObjectNotFound:
        return None
    return data.decode("utf-8", errors="replace")


def remote_config_problems(store: ObjectStore, where: str) -> list[str]:
    """Every problem of the shard's documents in ``store`` (the shard scope); ``where`` names it."""
    config_text = _text(store, CONFIG_KEY)
    if config_text is None:
        return [f"{where}{CONFIG_KEY}: does not exist in object storage"]
    try:
        config = load_config_text(config_text, where + CONFIG_KEY)
        dynamic = load_groups_text(_text(store, GROUPS_KEY) or "", where + GROUPS_KEY)
    except ConfigError as exc:
        return [f"{exc.source}: {problem}" for problem in exc.problems]
    problems = []
    for tenant, group in all_group_keys(config, dynamic):
        try:
            merged_group(config, dynamic, tenant, group)
        except (FailedPrecondition, NotFound) as exc:
            problems.append(f"{where}{GROUPS_KEY}: {tenant}.{group}: {exc}")
    return problems
