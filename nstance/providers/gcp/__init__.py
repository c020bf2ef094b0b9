"""The ``gcp`` provider package: Google Compute Engine VMs on ``google-cloud-compute`` (REST).

``provider`` holds the Provider implementation and ``gcp_provider_from_options``; ``resources`` turns
a create request and its args into an ``Instance`` body (scheduling, subnetwork paths, arch check);
``labels`` the ``nstance-*`` label rules; ``status`` the status mapping. Importing this package loads
the Compute SDK (a few seconds); the factory imports it only when the shard's provider is ``gcp``.
Nothing here decides whether to create or delete.
"""

from nstance.providers.gcp.provider import GcpProvider, gcp_provider_from_options, request_id_for

__all__ = ["GcpProvider", "gcp_provider_from_options", "request_id_for"]
