"""Server configuration: JSONC loading, typed schema and validation, static/dynamic group merge,
restricted group editing, config hashes and template rendering.

This package imports only ``nstance.core``, the standard library, pydantic and pyjson5. It
performs no I/O beyond reading a file path handed to a ``load_*_file`` function and no network
access. This module only re-exports the public names.
"""

from nstance.config.cluster import ClusterConfig, EncryptionKeyConfig, LeaderElectionConfig, SecretsConfig
from nstance.config.editing import GroupUpdate, apply_delete, apply_upsert
from nstance.config.errors import ConfigError, Problem, RenderError
from nstance.config.hashes import (
    canonical_json,
    group_etag,
    infra_hash,
    legacy_infra_hash,
    legacy_runtime_hash,
    runtime_hash,
)
from nstance.config.loader import (
    dump_groups_text,
    load_config_file,
    load_config_text,
    load_groups_file,
    load_groups_text,
    validate_config_file,
    validate_config_text,
)
from nstance.config.merge import MergedGroupConfig, all_group_keys, deep_merge, merged_group
from nstance.config.render import render_args, render_template
from nstance.config.resources import CertConfig, ImageConfig, LoadBalancerConfig
from nstance.config.schema import DynamicGroups, ServerConfig
from nstance.config.shard import ShardConfig
from nstance.config.templatedata import ClusterData, InstanceData, ProviderData, ServerData, TemplateData
from nstance.config.userdata import decode_userdata
from nstance.config.workloads import DefaultsConfig, FileConfig, GroupConfig, TemplateConfig, UserdataConfig

__all__ = [
    "CertConfig",
    "ClusterConfig",
    "ClusterData",
    "ConfigError",
    "DefaultsConfig",
    "DynamicGroups",
    "EncryptionKeyConfig",
    "FileConfig",
    "GroupConfig",
    "GroupUpdate",
    "ImageConfig",
    "InstanceData",
    "LeaderElectionConfig",
    "LoadBalancerConfig",
    "MergedGroupConfig",
    "Problem",
    "ProviderData",
    "RenderError",
    "SecretsConfig",
    "ServerConfig",
    "ServerData",
    "ShardConfig",
    "TemplateConfig",
    "TemplateData",
    "UserdataConfig",
    "all_group_keys",
    "apply_delete",
    "apply_upsert",
    "canonical_json",
    "decode_userdata",
    "deep_merge",
    "dump_groups_text",
    "group_etag",
    "infra_hash",
    "legacy_infra_hash",
    "legacy_runtime_hash",
    "load_config_file",
    "load_config_text",
    "load_groups_file",
    "load_groups_text",
    "merged_group",
    "render_args",
    "render_template",
    "runtime_hash",
    "validate_config_file",
    "validate_config_text",
]
