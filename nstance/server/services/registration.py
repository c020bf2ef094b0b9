"""RegistrationService handlers (server-auth TLS, no client certificate; a nonce proves the caller).

A translation only: request fields in, ``Registrar`` call, ``RegisterClientResponse`` out. Every
check (leadership, nonce JWT, key type, single use) is the registrar's; errors are raised as
``nstance.core.errors`` exceptions and mapped to gRPC codes by the interceptor.
"""

from __future__ import annotations

import grpc

from nstance.pki.certs import IssuedCertificate
from nstance.rpc import registration_pb2, registration_pb2_grpc
from nstance.server.identity.registration import Registrar
from nstance.server.services import convert


def _response(issued: IssuedCertificate) -> registration_pb2.RegisterClientResponse:
    return registration_pb2.RegisterClientResponse(
        client_certificate_pem=issued.cert_pem, expires_at=convert.timestamp(issued.not_after)
    )


class RegistrationServicer(registration_pb2_grpc.RegistrationServiceServicer):
    """The Registration API of one shard server."""

    def __init__(self, registrar: Registrar) -> None:
        self._registrar = registrar

    async def RegisterAgent(
        self, request: registration_pb2.RegisterClientRequest, context: grpc.aio.ServicerContext
    ) -> registration_pb2.RegisterClientResponse:
        issued = await self._registrar.register_agent(
            nonce_jwt=request.registration_nonce_jwt,
            public_key_pem=request.public_key_pem,
            private_ipv4=request.private_ipv4,
            private_ipv6=request.private_ipv6,
            hostname=request.hostname,
        )
        return _response(issued)

    async def RegisterOperator(
        self, request: registration_pb2.RegisterClientRequest, context: grpc.aio.ServicerContext
    ) -> registration_pb2.RegisterClientResponse:
        issued = await self._registrar.register_operator(
            nonce_jwt=request.registration_nonce_jwt, public_key_pem=request.public_key_pem
        )
        return _response(issued)
