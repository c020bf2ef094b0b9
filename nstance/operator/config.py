"""The operator config (``config.yaml``): parse it, check it, and follow it as it changes.

The document names the cluster, the tenant the operator acts for, and the shards with their two
addresses (reference §5.2)::

    cluster_id: prod
    tenant: default
    shards:
      us-west-2a: {registration_addr: "10.0.0.5:8992", operator_addr: "10.0.0.5:8993"}

``parse_config`` checks every field and reports every problem at once, each prefixed with the source
and the key path (``config.yaml: shards.zone-a.operator_addr: ...``). Identifiers follow the rule in
``nstance.core.ids``; addresses must be ``host:port`` (IPv6 in brackets); duplicate keys and unknown
keys are refused; ``sleep`` (upstream's v2 sleep policy) is accepted and ignored.

A ``ConfigSource`` keeps the last good config and publishes changes: ``ConfigMapSource`` follows a
ConfigMap through the API (get, then watch, filtered by name), ``FileSource`` polls a file (a mounted
ConfigMap is updated in place by the kubelet). Policy on change: an invalid document keeps the last good
config and reports the exact error (log, plus an Event on the ConfigMap); a changed ``cluster_id`` or
``tenant`` is refused the same way, because it would re-home every object the operator owns; a changed
shard map is published to subscribers (the runtime hands it to ``ShardSet.update``).

Must not: open shard connections or decide anything about them; it only says what the config is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from nstance.core.backoff import Backoff
from nstance.core.errors import InvalidArgument
from nstance.core.ids import identifier_problem
from nstance.operator.kube import CONFIGMAPS, Kube, KubeError, Object
from nstance.operator.yamltext import YamlFileError, read_text, yaml_error_text

log = logging.getLogger(__name__)

TOP_LEVEL_KEYS: Final = ("cluster_id", "tenant", "shards", "sleep")
SHARD_KEYS: Final = ("registration_addr", "operator_addr")


class ConfigError(InvalidArgument):
    """The config document is unusable; ``problems`` lists each one with its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("; ".join(f"{source}: {p}" for p in problems))


@dataclass(frozen=True)
class ShardEndpoint:
    """Where one shard's servers listen: registration (TLS) and the Operator API (mTLS)."""

    registration_addr: str
    operator_addr: str


@dataclass(frozen=True)
class OperatorConfig:
    """A checked operator config; ``shards`` keeps the document's order."""

    cluster_id: str
    tenant: str
    shards: Mapping[str, ShardEndpoint] = field(default_factory=dict)

    @property
    def capi_cluster_name(self) -> str:
        return f"{self.cluster_id}--{self.tenant}"


# --- parsing ---------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (line {mark.line + 1})", mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def address_problem(value: object) -> str | None:
    """Why ``value`` is not a ``host:port`` dial address, or None."""
    if not isinstance(value, str) or not value.strip():
        return f"expected a host:port string (got {value!r})"
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        return f"expected host:port (got {value!r})"
    if host.startswith("[") != host.endswith("]") or (not host.startswith("[") and ":" in host):
        return f"an IPv6 address must be written in brackets, e.g. [2600:1f18::a]:8993 (got {value!r})"
    if host in ("[]",):
        return f"empty host in {value!r}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"port {port!r} is not a number between 1 and 65535 (in {value!r})"
    return None


def _identifier(doc: Mapping[str, Any], key: str, problems: list[str]) -> str:
    value = doc.get(key)
    if value is None:
        problems.append(f"{key}: required (an identifier such as 'prod')")
        return ""
    if not isinstance(value, str):
        problems.append(f"{key}: must be a string (got {type(value).__name__} {value!r})")
        return ""
    problem = identifier_problem(value)
    if problem:
        problems.append(f"{key}: {value!r} {problem}")
    return value


def _unknown(keys: object, allowed: tuple[str, ...], where: str, problems: list[str]) -> None:
    if not isinstance(keys, Mapping):
        return
    for key in keys:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            problems.append(f"{prefix}{key}: unknown key (known keys: {', '.join(allowed)})")


def parse_config(text: str, source: str = "config.yaml") -> OperatorConfig:
    """Parse and check a config document; raise ConfigError listing every problem with its key path."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError(source, [yaml_error_text(exc)]) from None
    if doc is None:
        raise ConfigError(source, ["the document is empty; cluster_id, tenant and shards are required"])
    if not isinstance(doc, Mapping):
        raise ConfigError(source, [f"the document must be a mapping (got {type(doc).__name__})"])

    problems: list[str] = []
    _unknown(doc, TOP_LEVEL_KEYS, "", problems)
    cluster_id = _identifier(doc, "cluster_id", problems)
    tenant = _identifier(doc, "tenant", problems)

    shards: dict[str, ShardEndpoint] = {}
    raw_shards = doc.get("shards")
    if raw_shards is None:
        problems.append("shards: required (at least one shard with registration_addr and operator_addr)")
    elif not isinstance(raw_shards, Mapping):
        problems.append(
            f"shards: must be a mapping of shard id to addresses (got {type(raw_shards).__name__})"
        )
    elif not raw_shards:
        problems.append("shards: at least one shard is required")
    else:
        for shard, entry in raw_shards.items():
            path = f"shards.{shard}"
            if not isinstance(shard, str):
                problems.append(f"{path}: the shard id must be a string (got {shard!r})")
                continue
            problem = identifier_problem(shard)
            if problem:
                problems.append(f"{path}: shard id {shard!r} {problem}")
            if not isinstance(entry, Mapping):
                problems.append(f"{path}: must be a mapping with registration_addr and operator_addr")
                continue
            _unknown(entry, SHARD_KEYS, path, problems)
            addrs: dict[str, str] = {}
            for key in SHARD_KEYS:
                value = entry.get(key)
                if value is None:
                    problems.append(f"{path}.{key}: required (host:port)")
                    continue
                problem = address_problem(value)
                if problem:
                    problems.append(f"{path}.{key}: {problem}")
                else:
                    addrs[key] = str(value).strip()
            if len(addrs) == len(SHARD_KEYS):
                shards[shard] = ShardEndpoint(addrs["registration_addr"], addrs["operator_addr"])
    if problems:
        raise ConfigError(source, problems)
    if doc.get("sleep") is not None:
        log.info("%s: the 'sleep' policy is not supported by this operator and is ignored", source)
    return OperatorConfig(cluster_id=cluster_id, tenant=tenant, shards=shards)


def load_config_file(path: Path) -> OperatorConfig:
    """Read and check a config file; ConfigError names the file and each problem."""
    try:
        text = read_text(path)
    except YamlFileError as exc:
        raise ConfigError(str(path), [str(exc)]) from None
    return parse_config(text, str(path))


# --- following changes -------------------------------------------------------------------------------

Reporter = Callable[[str, str], Awaitable[None]]
"""``(reason, message)`` → record the problem where a user will see it (an Event), never raise."""


class ConfigSource:
    """The last good config and a way to wait for the next accepted change.

    Subclasses fetch the document (``run``) and hand each new text to ``offer``; this class applies the
    change policy and notifies ``wait_changed`` callers.
    """

    def __init__(self, description: str) -> None:
        self.description = description
        self.current: OperatorConfig | None = None
        self.problem = f"waiting for the operator config ({description})"
        self.version = 0
        self._changed = asyncio.Event()
        self._last_text: str | None = None
        self._last_missing = ""

    async def run(self) -> None:
        """Fetch the document for as long as the operator runs, handing each text to ``offer``.

        A plain ``ConfigSource`` is fed only through ``offer`` (embedding, tests): it has nothing to
        fetch and waits until cancelled. ``FileSource`` and ``ConfigMapSource`` override this.
        """
        await asyncio.Event().wait()

    async def wait_config(self) -> OperatorConfig:
        """The current config, waiting for the first good one."""
        while self.current is None:
            await self._wait()
        return self.current

    async def wait_changed(self, seen_version: int) -> OperatorConfig:
        """Return the config once a version newer than ``seen_version`` has been accepted."""
        while self.current is None or self.version == seen_version:
            await self._wait()
        return self.current

    async def _wait(self) -> None:
        event = self._changed
        await event.wait()

    def _publish(self) -> None:
        self.version += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def offer(self, text: str | None, missing: str = "", report: Reporter | None = None) -> None:
        """Consider a new document (``None`` = absent, ``missing`` says why); apply the change policy."""
        if text is None:
            if missing != self._last_missing:
                self._last_missing = missing
                self.problem = missing
                keep = "; keeping the last good config" if self.current is not None else ""
                log.error("operator config unavailable: %s%s", missing, keep)
            self._last_text = None
            return
        self._last_missing = ""
        if text == self._last_text:
            return
        self._last_text = text
        try:
            config = parse_config(text, self.description)
        except ConfigError as exc:
            keep = "; keeping the last good config" if self.current is not None else ""
            self.problem = str(exc)
            log.error("invalid operator config%s: %s", keep, exc)
            if report is not None:
                await report("InvalidConfig", f"{exc}{keep}")
            return
        old = self.current
        if old is not None and (config.cluster_id, config.tenant) != (old.cluster_id, old.tenant):
            message = (
                f"{self.description}: cluster_id/tenant changed from {old.cluster_id}/{old.tenant} to "
                f"{config.cluster_id}/{config.tenant}; refused because it would re-home every object this "
                f"operator owns. Keeping {old.cluster_id}/{old.tenant}; restart the operator to move it."
            )
            self.problem = message
            log.error("%s", message)
            if report is not None:
                await report("ConfigChangeRefused", message)
            return
        self.problem = ""
        if config == old:
            return
        self.current = config
        if old is None:
            log.info(
                "operator config loaded from %s: cluster %s, tenant %s, shards %s",
                self.description,
                config.cluster_id,
                config.tenant,
                ", ".join(config.shards),
            )
        else:
            log.info("operator config changed: shards now %s", ", ".join(config.shards))
        self._publish()


class FileSource(ConfigSource):
    """Polls a file (a mounted ConfigMap changes in place) every ``interval`` seconds."""

    def __init__(self, path: Path, *, interval: float = 10.0) -> None:
        super().__init__(str(path))
        self.path = path
        self.interval = interval

    async def poll(self) -> None:
        """Read the file once and offer its content."""
        try:
            text = await asyncio.to_thread(read_text, self.path)
        except YamlFileError as exc:  # a mounted ConfigMap can hold anything; the last good one stays
            await self.offer(None, f"{self.path}: the operator config is unusable: {exc}")
            return
        await self.offer(text)

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self.interval)


class ConfigMapSource(ConfigSource):
    """Follows one key of one ConfigMap through the API: a get, then a watch filtered by name."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        key: str,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(f"ConfigMap {namespace}/{name} key {key}")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.key = key
        self._backoff = backoff or Backoff(base=1.0, cap=30.0)
        self._object: Object | None = None

    async def _report(self, reason: str, message: str) -> None:
        if self._object is not None:
            await self.kube.event(self._object, reason=reason, message=message, warning=True)

    async def _take(self, obj: Object | None) -> None:
        where = f"ConfigMap {self.namespace}/{self.name}"
        if obj is None:
            await self.offer(
                None, f"{where} not found; create it with the key {self.key} (see docs/operator.md)"
            )
            return
        self._object = obj
        data = obj.get("data") or {}
        text = data.get(self.key)
        if not isinstance(text, str):
            known = ", ".join(sorted(data)) or "none"
            message = f"{where} has no key {self.key} (keys: {known})"
            await self.offer(None, message)
            return
        await self.offer(text, report=self._report)

    async def run(self) -> None:
        attempt = 0
        while True:
            try:
                obj = await self.kube.get(CONFIGMAPS, self.name, self.namespace)
                await self._take(obj)
                version = str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")
                async for kind, event_obj in self.kube.watch(
                    CONFIGMAPS, self.namespace, resource_version=version
                ):
                    attempt = 0
                    if kind == "ERROR":
                        raise KubeError(
                            int(event_obj.get("code") or 410), str(event_obj.get("reason")), "watch"
                        )
                    if (event_obj.get("metadata") or {}).get("name") != self.name:
                        continue
                    if kind == "DELETED":
                        await self._take(None)
                    elif kind in ("ADDED", "MODIFIED"):
                        await self._take(event_obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any API or transport failure: back off, re-read
                delay = self._backoff.delay(attempt)
                attempt += 1
                if self.current is None:
                    self.problem = f"cannot read ConfigMap {self.namespace}/{self.name}: {exc}"
                log.warning(
                    "following ConfigMap %s/%s failed (%s); retrying in %.1fs",
                    self.namespace,
                    self.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
