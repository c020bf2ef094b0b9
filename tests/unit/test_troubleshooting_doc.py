"""docs/troubleshooting.md quotes messages that the code still prints.

What a user notices: when they search the troubleshooting page for a message from a log, a CLI or a
status line, they find it, because every message below is quoted in the page and still written by the
code (checked by plain substring search, so a reworded message fails here until the page follows).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "troubleshooting.md"

#: (a fixed part of a message as the page quotes it, the source file that writes it)
QUOTED_MESSAGES: list[tuple[str, str]] = [
    # server start-up and /health
    ("required (or the matching NSTANCE_* variable)", "nstance/server/cli.py"),
    (
        "does not exist in object storage; upload the shard's config.jsonc there",
        "nstance/server/state/configstate.py",
    ),
    ("cannot load the shard config: object storage is unavailable", "nstance/server/state/configstate.py"),
    ("there is no cached copy yet", "nstance/server/state/configstate.py"),
    ("--advertise-host cannot be used when shard.advertise.", "nstance/server/net/addresses.py"),
    ("waiting for the cluster identity (CA and nonce key) from the cluster leader", "nstance/server/app.py"),
    ("waiting for the cluster identity and opening the gRPC APIs", "nstance/server/app.py"),
    # fail-safe holds (issue 13)
    ("instance records cannot be read", "nstance/server/reconcile/recovery.py"),
    ("unreadable instance record (its VM is kept, not deleted)", "nstance/server/reconcile/recovery.py"),
    ("no record claims it; adopting it from its tags", "nstance/server/reconcile/claims.py"),
    ("orphan deletions per", "nstance/server/reconcile/recovery.py"),
    ("registered instances stopped reporting at once; presuming a", "nstance/server/reconcile/brake.py"),
    ("is being rebuilt from object storage, retry", "nstance/db/engine.py"),
    ("rebuilding it from object storage", "nstance/server/reconcile/cacherepair.py"),
    ("had no record: written back from the cache", "nstance/server/reconcile/restore.py"),
    ("instance records were missing and have been written back", "nstance/server/reconcile/restore.py"),
    ("config not loaded: ", "nstance/server/net/http.py"),
    ("standby; leader: ", "nstance/server/net/http.py"),
    ("cannot listen on shard.bind.", "nstance/server/app.py"),
    ("recovery failed: ", "nstance/server/leadership/session.py"),
    ("but it was non-empty before", "nstance/server/state/configstate.py"),
    ("keeping the last good config: ", "nstance/server/state/confighealth.py"),
    ("refusing to write a new one holding only this change", "nstance/server/state/dynamic_groups.py"),
    ("reading the certificate deny-list (revoked/): ", "nstance/server/app.py"),
    ("scaled down to fit the open-file limit (raise LimitNOFILE)", "nstance/server/app.py"),
    ("(shard.limits.max_group_size)", "nstance/config/limits.py"),
    ("(shard.limits.max_groups_per_tenant)", "nstance/config/limits.py"),
    ("gc cycle failed: ", "nstance/server/leadership/session.py"),
    # config validation
    ("invalid configuration (", "nstance/config/errors.py"),
    ("invalid JSONC: ", "nstance/config/jsonc.py"),
    ("the document must be a JSON object", "nstance/config/loader.py"),
    ("unknown field", "nstance/config/translate.py"),
    ("is required", "nstance/config/translate.py"),
    ("must be one of: ", "nstance/config/translate.py"),
    ("must be a whole number", "nstance/config/translate.py"),
    ("days are not a unit; write hours", "nstance/core/durations.py"),
    ('must be a duration string such as "90s", "5m" or "1h30m"', "nstance/config/fields.py"),
    ("may contain only lowercase letters a-z, digits 0-9 and '-'", "nstance/core/ids.py"),
    ("must not contain '--' (reserved as a separator)", "nstance/core/ids.py"),
    ("must be exactly 3 lowercase letters", "nstance/core/ids.py"),
    ('is required when provider is "object-storage"', "nstance/config/cluster.py"),
    ('is only used with provider "object-storage"; remove it', "nstance/config/cluster.py"),
    ("must differ from ", "nstance/config/shard.py"),
    ('with a port between 1 and 65535 (got "', "nstance/config/shard.py"),
    (
        'is required when the provider is "aws" (the ENI that carries the leader IP)',
        "nstance/config/shard.py",
    ),
    ("must list at least one subnet", "nstance/config/shard.py"),
    ("cannot move a leader address; remove it", "nstance/config/checks.py"),
    ("keep a floating address with keepalived/VRRP between the servers instead", "nstance/config/checks.py"),
    ("is not defined in shard.subnet_pools", "nstance/config/checks.py"),
    ("is not defined in certificates", "nstance/config/checks.py"),
    ("is required (client or server)", "nstance/config/checks.py"),
    ('"tunnel" load balancers are not supported by this server yet', "nstance/config/checks.py"),
    ("(upstream's development provider) runs as", "nstance/config/fields.py"),
    ('Go template construct "', "nstance/config/gotemplate.py"),
    ("can't evaluate field", "nstance/config/goexec.py"),
    ("is only allowed with source", "nstance/config/workloads.py"),
    ("file name must be a clean relative path", "nstance/config/workloads.py"),
    ("not supported yet (", "nstance/config/loader.py"),
    # object storage
    ("access denied (", "nstance/objectstore/s3.py"),
    ("the S3 endpoint does not implement this request", "nstance/objectstore/s3.py"),
    (
        "Nstance needs If-Match/If-None-Match on PutObject and If-Match on DeleteObject",
        "nstance/objectstore/s3.py",
    ),
    ("cannot reach object storage: ", "nstance/objectstore/s3.py"),
    ("object storage is throttling (", "nstance/objectstore/s3.py"),
    ("concurrent conditional write in progress (409", "nstance/objectstore/s3.py"),
    (
        "the conditional write may or may not have been applied: re-read before retrying",
        "nstance/objectstore/s3.py",
    ),
    ("unsupported object storage URL", "nstance/objectstore/factory.py"),
    # secrets and the cluster identity
    ("run `nstance-admin cluster init`", "nstance/secrets/cluster_identity.py"),
    ("inconsistent CA state: cluster object", "nstance/secrets/cluster_identity.py"),
    ("restore the CA key from a backup", "nstance/secrets/cluster_identity.py"),
    ("stored cluster CA is unusable: ", "nstance/secrets/cluster_identity.py"),
    ("could not be decrypted with any of the", "nstance/secrets/objectstorage.py"),
    (
        "the key is wrong, or the stored object was altered or copied from another secret name",
        "nstance/secrets/objectstorage.py",
    ),
    ("refusing to store secrets unencrypted", "nstance/secrets/objectstorage.py"),
    ("is not set or empty; it must hold the secrets encryption key", "nstance/secrets/keys.py"),
    ("is not in a recognised format (", "nstance/secrets/keys.py"),
    ("cannot read encryption key file", "nstance/secrets/keys.py"),
    ("unknown secrets provider ", "nstance/secrets/factory.py"),
    ("unknown encryption key provider ", "nstance/secrets/keys.py"),
    ("AWS Secrets Manager could not", "nstance/secrets/aws.py"),
    ("Google Secret Manager could not", "nstance/secrets/googlesm.py"),
    ("exists but has no version", "nstance/secrets/googlesm.py"),
    ("it cannot issue", "nstance/pki/certs.py"),
    # elections and the leader address
    ("not assigned: ", "nstance/server/leadership/leadernet.py"),
    ("but not bindable on this host after", "nstance/server/leadership/leadernet.py"),
    (
        "provider cannot tell which VM this server runs on; start the server with --provider-instance-id",
        "nstance/server/leadership/leadernet.py",
    ),
    # registration
    ("this server is no longer the shard leader", "nstance/server/state/context.py"),
    ("operator registration is served by the cluster leader", "nstance/server/identity/operatorreg.py"),
    ("registration nonce expired at", "nstance/pki/nonce.py"),
    ("registration nonce signature is invalid (wrong key or altered token)", "nstance/pki/nonce.py"),
    ("registration nonce uses algorithm", "nstance/pki/nonce.py"),
    ("registration nonce is not a well-formed JWT", "nstance/pki/nonce.py"),
    ("has no pending registration on shard", "nstance/server/identity/agentreg.py"),
    (
        "unknown nonce: the instance was never created here or has been purged",
        "nstance/server/identity/agentreg.py",
    ),
    ("registration nonce already used: instance", "nstance/server/identity/agentreg.py"),
    ("registration nonce already used by a different public key", "nstance/server/identity/operatorreg.py"),
    ("has been deleted; it cannot register", "nstance/server/identity/agentreg.py"),
    ("accepted key types: ", "nstance/pki/certs.py"),
    ("is not an IPv4 address", "nstance/server/identity/agentreg.py"),
    ("retry with the same nonce", "nstance/server/identity/agentreg.py"),
    # certificates and the auth interceptor
    ("may not call this endpoint (role", "nstance/pki/peer.py"),
    ("has been revoked", "nstance/server/identity/interceptors.py"),
    ("client certificate expired at", "nstance/pki/peer.py"),
    ("check clocks", "nstance/pki/peer.py"),
    ("client certificate was not issued by this cluster's CA", "nstance/pki/peer.py"),
    ("client certificate has no role extension", "nstance/pki/peer.py"),
    ("has no access rule on this server; call refused", "nstance/server/identity/interceptors.py"),
    ("only the newest ", "nstance/server/identity/renewal.py"),
    ("certificate renewal is done by the cluster leader", "nstance/server/shard/shard.py"),
    ("internal error (ref ", "nstance/server/identity/interceptors.py"),
    ("is not implemented by this server", "nstance/server/identity/interceptors.py"),
    ("no answer within ", "nstance/admin/client.py"),
    # operator API calls
    ("this server is a standby and cannot make changes", "nstance/server/services/operator.py"),
    ("cannot be changed ", "nstance/config/editing.py"),
    ("args are set in the server config", "nstance/config/editing.py"),
    ("is not allowed for dynamic groups", "nstance/config/editing.py"),
    ('field "template" is required for a new group', "nstance/config/editing.py"),
    ("is not defined in the server config", "nstance/config/editing.py"),
    ("is already used by another instance", "nstance/server/shard/shard.py"),
    (
        "is not being drained; there is nothing to acknowledge (use DeleteInstance to remove it)",
        "nstance/server/shard/shard.py",
    ),
    ("does not exist in this shard", "nstance/server/shard/shard.py"),
    ("the shard config is not loaded yet; see the server's health endpoint", "nstance/server/shard/shard.py"),
    ("events behind and was closed; reconnect to receive a fresh snapshot", "nstance/server/state/events.py"),
    ("the image could not be resolved", "nstance/server/reconcile/images.py"),
    ("is full (", "nstance/server/state/provisioning.py"),
    ("cannot fetch userdata from", "nstance/server/state/provisioning.py"),
    # files delivered to agents
    ("cannot render files: ", "nstance/server/agents/hub.py"),
    ("create it with the secret store of cluster.secrets", "nstance/server/agents/files.py"),
    ("does not exist in the shard storage", "nstance/server/agents/files.py"),
    ("waiting for the agent to submit public key", "nstance/server/agents/files.py"),
    ("belongs to the cluster itself and is never delivered to agents", "nstance/server/agents/files.py"),
    ("and is never delivered to agents", "nstance/server/agents/files.py"),
    ("contains a line break or NUL, which env files cannot hold", "nstance/server/agents/files.py"),
    ("certificate withheld: the certificate log could not be written", "nstance/server/agents/files.py"),
    ("expected PEM CERTIFICATE blocks, found", "nstance/agent/files.py"),
    ("it must stay inside the receive directory", "nstance/agent/files.py"),
    ("file(s) failed; config.hash left unchanged", "nstance/agent/files.py"),
    # agent
    ("is required but not set", "nstance/agent/config.py"),
    ("must be an octal file mode like 0640", "nstance/agent/config.py"),
    ("must be host:port with a port from 1 to 65535, an IPv6 host in brackets", "nstance/agent/config.py"),
    ("is missing (the provider writes it from the instance userdata)", "nstance/agent/identity.py"),
    ("incomplete identity keypair", "nstance/agent/identity.py"),
    ("This nonce will not work again", "nstance/agent/register.py"),
    ("not registered: ", "nstance/agent/state.py"),
    ("health stream down: ", "nstance/agent/state.py"),
    ("; reconnecting in ", "nstance/agent/streams.py"),
    ("the server does not implement RenewAgentCertificate; keeping the current", "nstance/agent/renewal.py"),
    ("of its lifetime has passed) and has not been", "nstance/agent/renewal.py"),
    ("termination notice: ", "nstance/agent/spot.py"),
    # operator
    (
        "the webhook server needs a certificate: pass --webhook-cert and --webhook-key (PEM files)",
        "nstance/operator/settings.py",
    ),
    ("cannot load the Kubernetes credentials (", "nstance/operator/runtime.py"),
    ("not in a pod, and no --kubeconfig or KUBECONFIG", "nstance/operator/runtime.py"),
    ("must hold a YAML mapping", "nstance/operator/yamltext.py"),
    ("not valid YAML: ", "nstance/operator/yamltext.py"),
    ("unknown key (known keys: ", "nstance/operator/config.py"),
    ("expected host:port (got ", "nstance/operator/config.py"),
    ("InvalidConfig", "nstance/operator/config.py"),
    ("ConfigChangeRefused", "nstance/operator/config.py"),
    ("leader: no operator identity: ", "nstance/operator/runtime.py"),
    ("leader: no shard reachable (", "nstance/operator/runtime.py"),
    ("the registration nonce Secret", "nstance/operator/identity.py"),
    ("create a new one with `nstance-admin cluster nonce`", "nstance/operator/identity.py"),
    ("holding the cluster CA certificate", "nstance/operator/identity.py"),
    ("but the operator config has no such shard", "nstance/operator/controllers/machinepool/check_shards.py"),
    (
        "add it to the operator config or remove it from spec.shards",
        "nstance/operator/controllers/machinepool/check_shards.py",
    ),
    (
        "delete this pool or change its spec.group",
        "nstance/operator/controllers/machinepool/check_duplicate_group.py",
    ),
    ("StaticGroupKept", "nstance/operator/controllers/shardgroup/delete_group.py"),
    ("CreateInstanceFailed", "nstance/operator/controllers/machine/create_instance.py"),
    ("cannot change while the group is static (defined in the shard config)", "nstance/operator/webhook.py"),
    ("NstanceDrainBlocked", "nstance/operator/drain/reasons.py"),
    ("NstanceDrainTimeout", "nstance/operator/drain/reasons.py"),
    # nstance-admin
    ("--servers is required (or set", "nstance/admin/client.py"),
    ("or use --all-shards (known shards: ", "nstance/admin/client.py"),
    ("no usable operator identity in", "nstance/admin/client.py"),
    ("is unusable: ", "nstance/admin/client.py"),
    ("does not exist on this shard", "nstance/admin/client.py"),
    ("nothing was changed. Use --exist-ok to accept this.", "nstance/admin/cluster.py"),
    ("is invalid; nothing was uploaded", "nstance/admin/configcmds.py"),
    ("is invalid; nothing was planned", "nstance/admin/plan.py"),
    ("cannot compare with the stored config, it is invalid: ", "nstance/admin/plan.py"),
    ("must be a positive duration", "nstance/admin/cluster.py"),
    (
        "already holds an operator identity; use --force to replace it, or choose another --output-dir",
        "nstance/admin/cluster.py",
    ),
    ("is already revoked since", "nstance/admin/certs.py"),
    # providers
    (
        "grant the IAM action listed in docs/provider-aws.md to the server's credentials",
        "nstance/providers/aws/calls.py",
    ),
    ("no AWS credentials found; give the server an instance profile", "nstance/providers/aws/calls.py"),
    ("still throttled after", "nstance/providers/aws/calls.py"),
    ("; retry later", "nstance/providers/aws/calls.py"),
    ("rejected the request (", "nstance/providers/aws/calls.py"),
    ("does not exist in this region", "nstance/providers/aws/provider.py"),
    ("itself; remove it from args", "nstance/providers/aws/args.py"),
    ("is not an EC2 instance type in this region", "nstance/providers/aws/types.py"),
    (
        "no available image matches the filters and owners; check them, or set a fallback",
        "nstance/providers/aws/images.py",
    ),
    ("does not exist", "nstance/providers/aws/loadbalancers.py"),
    ("is not an address of network interface", "nstance/providers/aws/network.py"),
    ("created with another idempotency token", "nstance/providers/aws/provider.py"),
    ("the GCP project id is required (or set GOOGLE_CLOUD_PROJECT)", "nstance/providers/gcp/provider.py"),
    ("no Google credentials found", "nstance/providers/gcp/provider.py"),
    (
        "required for gcp (for example projects/debian-cloud/global/images/family/",
        "nstance/providers/gcp/resources.py",
    ),
    ("not a gcp arg; allowed: ", "nstance/providers/gcp/resources.py"),
    ("(or the service account cannot see it)", "nstance/providers/gcp/provider.py"),
    ("(capacity or quota; retry later or use another zone/type)", "nstance/providers/gcp/calls.py"),
    ("inserts with this idempotency token", "nstance/providers/gcp/provider.py"),
    ("not a numeric GCE id; check GCE_METADATA_HOST", "nstance/providers/gcp/provider.py"),
    (
        "the proxmox provider needs an API token: set token_id (or PROXMOX_TOKEN_ID)",
        "nstance/providers/proxmox/options.py",
    ),
    ("is not a readable file", "nstance/providers/proxmox/options.py"),
    ("lacks a privilege or its secret is wrong", "nstance/providers/proxmox/provider.py"),
    ("(or the API token may not audit it)", "nstance/providers/proxmox/provider.py"),
    ("convert it with 'qm template' or name another", "nstance/providers/proxmox/provider.py"),
    ("MiB of memory free for", "nstance/providers/proxmox/provider.py"),
    ("is still being cloned after", "nstance/providers/proxmox/provider.py"),
    ("VMIDs in a row were taken by someone else while creating", "nstance/providers/proxmox/provider.py"),
]


@pytest.fixture(scope="module")
def page() -> str:
    return " ".join(DOC.read_text(encoding="utf-8").split())


@functools.cache
def string_literals(source: str) -> tuple[str, ...]:
    """Every string literal of a Python file as the program sees it.

    Adjacent literals are already joined by the parser, so a message split over several source lines
    is one string here; in an f-string each replacement field becomes NUL, so a quoted phrase can only
    match text the program writes literally.
    """
    tree = ast.parse((REPO_ROOT / source).read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            found.append(
                "".join(
                    part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "\0"
                    for part in node.values
                )
            )
    return tuple(found)


@pytest.mark.parametrize(("phrase", "source"), QUOTED_MESSAGES, ids=[p for p, _ in QUOTED_MESSAGES])
def test_quoted_message_is_on_the_page_and_in_the_code(page: str, phrase: str, source: str) -> None:
    assert phrase in page, f"docs/troubleshooting.md no longer quotes {phrase!r}"
    literals = string_literals(source)
    assert any(phrase in text for text in literals), (
        f"{source} no longer writes {phrase!r}: update docs/troubleshooting.md"
    )


def test_every_source_file_exists() -> None:
    missing = sorted({source for _, source in QUOTED_MESSAGES if not (REPO_ROOT / source).is_file()})
    assert not missing, missing


def test_every_section_of_the_page_is_covered(page: str) -> None:
    """Each group of messages on the page keeps at least one checked quote, so no section rots unseen."""
    raw = DOC.read_text(encoding="utf-8")
    sections = [line[3:] for line in raw.splitlines() if line.startswith("## ")]
    headings = [s for s in sections if s not in ("Where messages appear", "gRPC status codes")]
    body = [" ".join(part.split()) for part in raw.split("\n## ")]
    for heading in headings:
        text = next(part for part in body if part.startswith(heading))
        assert any(phrase in text for phrase, _ in QUOTED_MESSAGES), (
            f"no checked quote in section {heading!r}"
        )
