"""The AWS EC2 provider (boto3): instances, images, target groups and the leader ENI.

Importing this package imports boto3; the provider factory imports it only for ``aws`` shards.
Nothing here may be imported by nstance.core, nstance.config or any program package directly.
"""

from nstance.providers.aws.loadbalancers import TargetGroupRef, target_groups_from_config
from nstance.providers.aws.provider import OPTION_KEYS, AwsProvider, aws_provider_from_options

__all__ = [
    "OPTION_KEYS",
    "AwsProvider",
    "TargetGroupRef",
    "aws_provider_from_options",
    "target_groups_from_config",
]
