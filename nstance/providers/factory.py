"""Build the shard's Provider from its ``shard.infra`` config section.

Only chooses and constructs: ``sim``, ``local``, ``aws`` (EC2 via boto3), ``google`` (Compute Engine via
google-cloud-compute) and ``proxmox`` (Proxmox VE via proxmoxer). It makes no provider calls and imports
a provider's module (and its cloud SDK) only when that provider is asked for.
"""

from __future__ import annotations

from pathlib import Path

from nstance.config.shard import InfraConfig
from nstance.core.clock import Clock
from nstance.core.errors import InvalidArgument
from nstance.providers.base import Provider

AVAILABLE: tuple[str, ...] = ("aws", "google", "local", "proxmox", "sim")


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
    if infra.provider == "aws":
        from nstance.providers.aws import aws_provider_from_options

        options = {"region": infra.region, **infra.options}  # shard.infra.region unless options say otherwise
        return aws_provider_from_options(options, clock=clock, base_dir=base_dir, zone=infra.zone)
    if infra.provider == "google":
        from nstance.providers.gcp import gcp_provider_from_options

        return gcp_provider_from_options(infra.options, clock=clock, base_dir=base_dir, zone=infra.zone)
    if infra.provider == "proxmox":
        from nstance.providers.proxmox import proxmox_provider_from_options

        return proxmox_provider_from_options(infra.options, clock=clock, base_dir=base_dir, zone=infra.zone)
    raise InvalidArgument(
        f'shard.infra.provider: "{infra.provider}" is not a provider; use one of {", ".join(AVAILABLE)}'
    )
