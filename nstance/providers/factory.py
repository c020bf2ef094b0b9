"""Build the shard's Provider from its ``shard.infra`` config section.

Only chooses and constructs: ``sim`` and ``local`` are available; the cloud providers (``aws``,
``google``, ``proxmox``) are refused with an error naming the config path until they are built. It
makes no provider calls and imports a provider's module only when that provider is asked for.
"""

from __future__ import annotations

from pathlib import Path

from nstance.config.shard import InfraConfig
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument
from nstance.providers.base import Provider

AVAILABLE: tuple[str, ...] = ("local", "sim")


def create_provider(infra: InfraConfig, *, clock: Clock, base_dir: Path) -> Provider:
    """The provider ``infra.provider`` names, built from ``infra.options``.

    Relative paths in the options resolve under ``base_dir``.
    """
    if infra.provider == "sim":
        from nstance.providers.sim import sim_provider_from_options

        return sim_provider_from_options(infra.options, clock=clock, base_dir=base_dir, zone=infra.zone)
    if infra.provider == "local":
        from nstance.providers.local import local_provider_from_options

        return local_provider_from_options(infra.options, clock=clock, base_dir=base_dir, zone=infra.zone)
    raise InvalidArgument(
        f'shard.infra.provider: "{infra.provider}" is not available in this build yet; use "local" or "sim"'
    )
