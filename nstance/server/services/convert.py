"""Conversions between protobuf messages of ``nstance.v1`` and the server's plain types.

Only translation lives here: no validation beyond shape (identifier rules are checked by the shard),
no I/O. Timestamps are timezone-aware UTC on our side.
"""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from nstance.config import GroupUpdate
from nstance.rpc import operator_pb2
from nstance.server.shard.api import ConfigStatusView, GroupView, InstanceRequest, InstanceView
from nstance.server.state.events import ErrorEventData, GroupEventData, InstanceEventData


def timestamp(value: datetime | None) -> Timestamp | None:
    """A protobuf Timestamp for ``value`` (None stays None)."""
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value.astimezone(UTC))
    return ts


def group_status(view: GroupView) -> operator_pb2.GroupStatus:
    """GroupStatus for one group."""
    return operator_pb2.GroupStatus(
        key=view.key,
        tenant=view.tenant,
        template=view.template,
        size=view.size,
        instance_type=view.instance_type,
        subnet_pool=view.subnet_pool,
        vars=view.vars,
        is_static=view.is_static,
        etag=view.etag,
        actual_size=view.actual_size,
        provider_ids=sorted(view.provider_ids),
    )


def group_update(config: operator_pb2.GroupConfig) -> GroupUpdate:
    """A GroupUpdate from an UpsertGroup request's config (size is always applied, as upstream)."""
    return GroupUpdate(
        template=config.template or None,
        size=config.size,
        instance_type=config.instance_type or None,
        subnet_pool=config.subnet_pool or None,
        vars=dict(config.vars),
        args=dict(config.args) or None,
    )


def instance_request(request: operator_pb2.CreateInstanceRequest) -> InstanceRequest:
    """The shard-side form of CreateInstance."""
    cfg = request.config
    return InstanceRequest(
        group=cfg.group,
        instance_id=request.instance_id,
        template=cfg.template,
        instance_type=cfg.instance_type,
        subnet_pool=cfg.subnet_pool,
        vars=dict(cfg.vars),
    )


def instance_status(view: InstanceView) -> operator_pb2.InstanceStatusResponse:
    """InstanceStatusResponse for one instance."""
    return operator_pb2.InstanceStatusResponse(
        instance_id=view.instance_id,
        tenant=view.tenant,
        status=view.provider_status or view.status,
        created_at=timestamp(view.created_at),
        last_seen=timestamp(view.last_seen),
        provider_instance_id=view.provider_id,
    )


def instance_summary(view: InstanceView) -> operator_pb2.InstanceSummary:
    """InstanceSummary (ListInstances) for one instance."""
    return operator_pb2.InstanceSummary(
        instance_id=view.instance_id,
        group=view.group,
        on_demand=view.on_demand,
        status=view.status,
        provider_instance_id=view.provider_id,
        created_at=timestamp(view.created_at),
        last_seen=timestamp(view.last_seen),
        draining=view.draining,
    )


def config_status(view: ConfigStatusView) -> operator_pb2.ConfigStatusResponse:
    """ConfigStatusResponse for the loaded config object."""
    return operator_pb2.ConfigStatusResponse(
        etag=view.etag, last_modified=timestamp(view.last_modified), size=view.size
    )


def group_event(event: GroupEventData, view: GroupView | None) -> operator_pb2.GroupEvent:
    """GroupEvent; a delete (or a group no longer visible) carries only key and tenant."""
    if event.kind == "delete" or view is None:
        return operator_pb2.GroupEvent(
            type=operator_pb2.GroupEvent.TYPE_DELETE,
            group=operator_pb2.GroupStatus(key=event.group, tenant=event.tenant),
        )
    return operator_pb2.GroupEvent(type=operator_pb2.GroupEvent.TYPE_UPSERT, group=group_status(view))


def instance_event(event: InstanceEventData) -> operator_pb2.InstanceEvent:
    """InstanceEvent for a drain notice, a deletion or a deleted instance."""
    return operator_pb2.InstanceEvent(
        instance_id=event.instance_id,
        tenant=event.tenant,
        provider_instance_id=event.provider_id,
        group=event.group,
        status=event.status,
        reason=event.reason,
        unhealthy_at=timestamp(event.unhealthy_at),
        delete_at=timestamp(event.delete_at),
    )


def error_event(event: ErrorEventData) -> operator_pb2.ErrorEvent:
    """ErrorEvent."""
    return operator_pb2.ErrorEvent(
        group=event.group,
        instance_id=event.instance_id,
        error=event.error,
        timestamp=timestamp(event.timestamp),
    )
