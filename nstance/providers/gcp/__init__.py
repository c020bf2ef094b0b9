"""The ``gcp`` provider package: Google Compute Engine VMs on ``google-cloud-compute`` (REST).

``provider`` holds the Provider implementation (with the optional capabilities of
``nstance.providers.features``) and ``gcp_provider_from_options``; ``calls`` the retries, error mapping
and operation waits every API call goes through; ``resources`` turns a create request and its args
into an ``Instance`` body (scheduling, resource paths, arch check); ``loadbalancers`` attaches VMs to
zonal network endpoint groups; ``network`` moves the leader alias IP; ``labels`` the ``nstance-*``
label rules; ``status`` the status mapping. Importing this package loads the Compute SDK (a few
seconds); the factory imports it only when the shard's provider is ``gcp``. Nothing here decides
whether to create or delete.
"""

from nstance.providers.gcp.provider import GcpProvider, gcp_provider_from_options, request_id_for

__all__ = ["GcpProvider", "gcp_provider_from_options", "request_id_for"]
