"""OperatorService handlers (mTLS, role ``operator``; the tenant is the certificate's O).

Every handler is a translation: protobuf in, ``ShardAPI`` call, protobuf out. Reads (ListGroups,
ListInstances - added here, upstream lists no instances - GetInstanceStatus, GetConfigStatus) and the
watch streams are answered by standbys too; every call
that changes something is refused on a standby with FAILED_PRECONDITION naming the leader's address,
so a client can retry there. Watch streams subscribe before taking their snapshot, so no event
between the snapshot and the live stream is lost, and any number of watchers may follow one tenant.
ListInstances answers in pages when asked (``page_size``, ``paging``): a tenant of 100,000 instances
is about 9 MB, more than one message may carry, and a request for all of them that does not fit gets
RESOURCE_EXHAUSTED saying so instead of gRPC's own size error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf.empty_pb2 import Empty

from nstance.config.limits import LimitsConfig
from nstance.core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from nstance.core.ids import identifier_problem
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.server.identity.interceptors import current_peer
from nstance.server.services import convert, paging
from nstance.server.shard.api import InstanceView, ShardAPI

STREAMED_INSTANCE_STATUSES = frozenset({"pending_deletion", "deleted"})
"""What WatchInstances sends of the shard's instance events (the shard also publishes "deleting")."""


def _tenant() -> str:
    return current_peer().tenant


def _check_key(value: str, what: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise InvalidArgument(f"{what} {value!r}: {problem}")
    return value


class OperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    """The Operator API of one shard server."""

    def __init__(self, shard: ShardAPI, *, max_message_bytes: int = LimitsConfig().max_message_bytes) -> None:
        self._shard = shard
        #: The largest answer the server sends (``shard.limits.max_message_bytes``, as at start-up).
        self._max_message_bytes = max_message_bytes

    def _require_leader(self) -> None:
        if not self._shard.is_leader():
            addr = self._shard.leader_address()
            where = f"the shard leader is at {addr}" if addr else "no shard leader is known yet"
            raise FailedPrecondition(f"this server is a standby and cannot make changes; {where}")

    # --- reads ------------------------------------------------------------------------------

    async def ListGroups(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListGroupsResponse:
        tenant = _tenant()
        # The answer too is built in the thread: at 100,000 instances it holds as many provider ids.
        return await asyncio.to_thread(
            lambda: operator_pb2.ListGroupsResponse(groups=self._group_statuses(tenant))
        )

    def _group_statuses(self, tenant: str) -> list[operator_pb2.GroupStatus]:
        """Every group of ``tenant`` as GroupStatus (blocking: one query over the tenant's instances)."""
        return [convert.group_status(view) for view in self._shard.list_groups(tenant)]

    async def GetInstanceStatus(
        self, request: operator_pb2.GetInstanceStatusRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.InstanceStatusResponse:
        if not request.instance_id:
            raise InvalidArgument("instance_id is required")
        return convert.instance_status(await self._shard.instance_status(_tenant(), request.instance_id))

    async def ListInstances(
        self, request: operator_pb2.ListInstancesRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListInstancesResponse:
        if request.group:
            _check_key(request.group, "group")
        limit = paging.page_limit(request.page_size)
        after = paging.decode_token(request.page_token) if request.page_token else None
        views = await self._shard.list_instances(
            _tenant(), request.group, after=after, limit=None if limit is None else limit + 1
        )
        # Built in a thread: a page of 2,000 instances costs about 15 ms of protobuf work.
        return await asyncio.to_thread(self._instances_page, views, limit)

    def _instances_page(
        self, views: list[InstanceView], limit: int | None
    ) -> operator_pb2.ListInstancesResponse:
        """The answer holding ``views`` (one more than ``limit`` when another page follows), cut to fit."""
        more = False
        if limit is not None and len(views) > limit:  # one more was read: another page follows
            del views[limit:]
            more = True
        response = operator_pb2.ListInstancesResponse(instances=[convert.instance_summary(v) for v in views])
        size = response.ByteSize()
        if size > self._max_message_bytes:
            if limit is None:
                raise ResourceExhausted(
                    f"ListInstances: the {len(views)} instances ({size} bytes) do not fit in one answer of "
                    f"at most {self._max_message_bytes} bytes (shard.limits.max_message_bytes); ask for "
                    "pages (page_size), or for one group"
                )
            # Fewer than asked, so that the page fits: cut in proportion, with a tenth to spare for the
            # instances' varying sizes, and again should that not do.
            while size > self._max_message_bytes and len(views) > 1:
                keep = max(1, min(len(views) - 1, len(views) * self._max_message_bytes * 9 // (size * 10)))
                del response.instances[keep:]
                del views[keep:]
                size = response.ByteSize()
            more = True
        if more and views:
            response.next_page_token = paging.encode_token(views[-1].created_at, views[-1].instance_id)
        return response

    async def GetConfigStatus(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ConfigStatusResponse:
        return convert.config_status(self._shard.config_status())

    # --- changes ----------------------------------------------------------------------------

    async def UpsertGroup(
        self, request: operator_pb2.UpsertGroupRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.GroupStatus:
        _check_key(request.key, "group key")
        if request.config.size < 0:
            raise InvalidArgument(
                f"group {request.key!r}: size must not be negative (got {request.config.size})"
            )
        self._require_leader()
        view = await self._shard.upsert_group(_tenant(), request.key, convert.group_update(request.config))
        return convert.group_status(view)

    async def DeleteGroup(
        self, request: operator_pb2.DeleteGroupRequest, context: grpc.aio.ServicerContext
    ) -> Empty:
        _check_key(request.key, "group key")
        self._require_leader()
        await self._shard.delete_group(_tenant(), request.key)
        return Empty()

    async def CreateInstance(
        self, request: operator_pb2.CreateInstanceRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CreateInstanceResponse:
        if not request.HasField("config") or not request.config.group:
            raise InvalidArgument("config.group is required: an on-demand instance belongs to a group")
        _check_key(request.config.group, "group")
        self._require_leader()
        instance_id, status = await self._shard.create_instance(_tenant(), convert.instance_request(request))
        return operator_pb2.CreateInstanceResponse(instance_id=instance_id, status=status)

    async def DeleteInstance(
        self, request: operator_pb2.DeleteInstanceRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.DeleteInstanceResponse:
        if not request.instance_id:
            raise InvalidArgument("instance_id is required")
        self._require_leader()
        status = await self._shard.delete_instance(_tenant(), request.instance_id)
        return operator_pb2.DeleteInstanceResponse(status=status)

    async def AcknowledgeDrained(
        self, request: operator_pb2.DrainAckRequest, context: grpc.aio.ServicerContext
    ) -> Empty:
        if not request.instance_id:
            raise InvalidArgument("instance_id is required")
        self._require_leader()
        await self._shard.acknowledge_drained(_tenant(), request.instance_id)
        return Empty()

    async def RefreshConfig(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.RefreshConfigResponse:
        result = await self._shard.refresh_config()
        return operator_pb2.RefreshConfigResponse(
            updated=result.updated, prev_etag=result.prev_etag, etag=result.etag
        )

    async def RenewCertificate(
        self, request: operator_pb2.RenewCertificateRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.RenewCertificateResponse:
        if not request.public_key_pem:
            raise InvalidArgument("public_key_pem is required")
        peer = current_peer()
        issued = await self._shard.renew_certificate(peer.tenant, peer.client_id, request.public_key_pem)
        return operator_pb2.RenewCertificateResponse(
            client_certificate_pem=issued.cert_pem, expires_at=convert.timestamp(issued.expires_at)
        )

    # --- streams ----------------------------------------------------------------------------

    async def WatchGroups(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operator_pb2.GroupEvent]:
        tenant = _tenant()
        async with self._shard.events.groups.subscribe(tenant) as live:
            await context.send_initial_metadata(())
            for status in await asyncio.to_thread(self._group_statuses, tenant):
                yield operator_pb2.GroupEvent(type=operator_pb2.GroupEvent.TYPE_UPSERT, group=status)
            async for event in live:
                # Only the changed group's view: listing every group per event made each change
                # cost one instance query per group per subscriber.
                current = (
                    None
                    if event.kind == "delete"
                    else await asyncio.to_thread(self._shard.find_group, tenant, event.group)
                )
                yield convert.group_event(event, current)

    async def WatchInstances(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operator_pb2.InstanceEvent]:
        tenant = _tenant()
        async with self._shard.events.instances.subscribe(tenant) as live:
            # Headers go out once subscribed, so a client can tell a quiet stream is live.
            await context.send_initial_metadata(())
            # In a thread: the query looks at every instance of the tenant (100,000 on a large shard).
            for view, reason, delete_at in await asyncio.to_thread(self._shard.draining_instances, tenant):
                yield operator_pb2.InstanceEvent(
                    instance_id=view.instance_id,
                    tenant=view.tenant,
                    provider_instance_id=view.provider_id,
                    group=view.group,
                    status="pending_deletion",
                    reason=reason,
                    delete_at=convert.timestamp(delete_at),
                )
            async for event in live:
                # Only drain notices and deletions, as upstream's server sends: its operator drains
                # the machine of every event but "deleted", so a "deleting" notice would cordon and
                # evict a machine that is already going and hold that shard's drains for minutes.
                if event.status in STREAMED_INSTANCE_STATUSES:
                    yield convert.instance_event(event)

    async def WatchErrors(
        self, request: Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operator_pb2.ErrorEvent]:
        async with self._shard.events.errors.subscribe(_tenant()) as live:
            await context.send_initial_metadata(())
            async for event in live:
                yield convert.error_event(event)
