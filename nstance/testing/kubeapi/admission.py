"""Validating admission webhooks: match ``ValidatingWebhookConfiguration`` rules and call the webhooks.

For each webhook whose rules (apiGroups, apiVersions, resources incl. ``x/status``, operations, scope)
and ``objectSelector``/``namespaceSelector`` match a request, POST an ``admission.k8s.io/v1``
AdmissionReview to ``clientConfig.url`` over HTTPS (verified with ``clientConfig.caBundle``), honour
``timeoutSeconds`` and ``failurePolicy``, and turn a denial into the real server's error. ``service``
references are refused with a clear error (there is no in-cluster networking here).
``MutatingWebhookConfiguration`` objects are stored but never called.

It must not touch the object store directly: the caller passes in the configurations, the objects and the
namespace labels.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fnmatch
import json
import logging
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from nstance.testing.kubeapi import errors
from nstance.testing.kubeapi.resources import ResourceType
from nstance.testing.kubeapi.selectors import Requirement, matches_labels, selector_from_object

JSON = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdmissionRequest:
    """What is being done: ``operation`` is CREATE, UPDATE or DELETE."""

    operation: str
    rtype: ResourceType
    subresource: str | None
    namespace: str | None
    name: str
    obj: JSON | None
    old: JSON | None
    dry_run: bool = False
    username: str = "system:admin"


def _listed(values: Any, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def rule_matches(rule: Any, request: AdmissionRequest) -> bool:
    """One ``rules[]`` entry against a request (resource ``*``, ``x/*``, ``*/status`` patterns allowed)."""
    if not isinstance(rule, dict):
        return False
    rtype = request.rtype
    if not _listed(rule.get("apiGroups"), rtype.group) or not _listed(rule.get("apiVersions"), rtype.version):
        return False
    if not _listed(rule.get("operations"), request.operation):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Namespaced" and not rtype.namespaced) or (scope == "Cluster" and rtype.namespaced):
        return False
    wanted = rtype.plural if not request.subresource else f"{rtype.plural}/{request.subresource}"
    resources = rule.get("resources") or []
    return any(isinstance(p, str) and _resource_pattern(p, wanted) for p in resources)


def _resource_pattern(pattern: str, wanted: str) -> bool:
    if pattern == "*":
        return "/" not in wanted
    if pattern == "*/*":
        return True
    return fnmatch.fnmatchcase(wanted, pattern)


def webhook_matches(
    webhook: JSON, request: AdmissionRequest, namespace_labels: Mapping[str, str] | None
) -> bool:
    if not any(rule_matches(rule, request) for rule in webhook.get("rules") or []):
        return False
    where = f"webhook {webhook.get('name')!r}"
    object_selector = selector_from_object(webhook.get("objectSelector"), f"{where} objectSelector")
    if object_selector:
        candidates = [o for o in (request.obj, request.old) if o is not None]
        if not any(matches_labels(object_selector, o) for o in candidates):
            return False
    namespace_selector = selector_from_object(webhook.get("namespaceSelector"), f"{where} namespaceSelector")
    if namespace_selector and request.rtype.namespaced and namespace_labels is not None:
        labels = dict(namespace_labels)
        if not all(isinstance(r, Requirement) and r.matches(labels) for r in namespace_selector):
            return False
    return True


def review_body(webhook: JSON, request: AdmissionRequest) -> JSON:
    rtype = request.rtype
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": rtype.group, "version": rtype.version, "kind": rtype.kind},
            "resource": {"group": rtype.group, "version": rtype.version, "resource": rtype.plural},
            "requestKind": {"group": rtype.group, "version": rtype.version, "kind": rtype.kind},
            "requestResource": {"group": rtype.group, "version": rtype.version, "resource": rtype.plural},
            **(
                {"subResource": request.subresource, "requestSubResource": request.subresource}
                if request.subresource
                else {}
            ),
            "name": request.name,
            **({"namespace": request.namespace} if request.namespace else {}),
            "operation": request.operation,
            "userInfo": {"username": request.username, "groups": ["system:masters", "system:authenticated"]},
            "object": request.obj,
            "oldObject": request.old,
            "dryRun": request.dry_run,
            "options": {"kind": f"{request.operation.capitalize()}Options", "apiVersion": "meta.k8s.io/v1"},
        },
    }


class Admission:
    """Calls validating webhooks; one aiohttp session per CA bundle."""

    def __init__(self) -> None:
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    def _session(self, ca_bundle: str | None, webhook_name: str) -> aiohttp.ClientSession:
        key = ca_bundle or ""
        session = self._sessions.get(key)
        if session is None:
            context = ssl.create_default_context()
            if ca_bundle:
                try:
                    pem = base64.b64decode(ca_bundle, validate=True).decode()
                    context.load_verify_locations(cadata=pem)
                except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
                    raise _WebhookCallError(
                        f"clientConfig.caBundle is not a base64 PEM bundle: {exc}"
                    ) from None
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
            self._sessions[key] = session
        return session

    async def validate(
        self,
        configurations: list[JSON],
        request: AdmissionRequest,
        namespace_labels: Mapping[str, str] | None = None,
    ) -> None:
        """Raise the real server's APIError when a matching webhook denies (or fails with policy Fail)."""
        for config in configurations:
            for webhook in config.get("webhooks") or []:
                if not isinstance(webhook, dict):
                    continue
                try:
                    matched = webhook_matches(webhook, request, namespace_labels)
                except errors.APIError as exc:
                    log.warning(
                        "skipping webhook %r with a bad selector: %s", webhook.get("name"), exc.message
                    )
                    continue
                if matched:
                    await self._call(webhook, request)

    async def _call(self, webhook: JSON, request: AdmissionRequest) -> None:
        name = str(webhook.get("name", ""))
        fail_closed = webhook.get("failurePolicy", "Fail") != "Ignore"
        try:
            response = await self._post(webhook, request)
        except _WebhookCallError as exc:
            log.info("webhook %s failed (%s): %s", name, "Fail" if fail_closed else "Ignore", exc)
            if fail_closed:
                raise errors.internal(f'failed calling webhook "{name}": {exc}') from None
            return
        if response.get("allowed") is True:
            return
        status = response.get("status") or {}
        code: int = status["code"] if isinstance(status.get("code"), int) else 0
        message = status.get("message") or ""
        reason = status.get("reason") or ""
        text = f'admission webhook "{name}" denied the request'
        if message:
            text += f": {message}"
        elif reason:
            text += f": {reason}"
        http_code = code if code >= 400 else 400
        raise errors.APIError(http_code, reason or ("BadRequest" if http_code == 400 else "Forbidden"), text)

    async def _post(self, webhook: JSON, request: AdmissionRequest) -> JSON:
        client_config = webhook.get("clientConfig") or {}
        url = client_config.get("url")
        if not url:
            if client_config.get("service"):
                raise _WebhookCallError(
                    "clientConfig.service is not supported by the emulator (no cluster networking); "
                    "use clientConfig.url"
                )
            raise _WebhookCallError("clientConfig has neither url nor service")
        timeout = webhook.get("timeoutSeconds") or 10
        session = self._session(client_config.get("caBundle"), str(webhook.get("name")))
        body = review_body(webhook, request)
        try:
            async with asyncio.timeout(float(timeout)):
                async with session.post(url, json=body) as response:
                    text = await response.text()
                    if response.status >= 400:
                        raise _WebhookCallError(
                            f"the server responded with HTTP {response.status}: {text[:200]}"
                        )
        except TimeoutError:
            raise _WebhookCallError(f"context deadline exceeded after {timeout}s") from None
        except aiohttp.ClientError as exc:
            raise _WebhookCallError(f"Post {url!r}: {exc}") from None
        try:
            review = json.loads(text)
        except ValueError:
            raise _WebhookCallError("the webhook answered with a body that is not JSON") from None
        answer = review.get("response") if isinstance(review, dict) else None
        if not isinstance(answer, dict):
            raise _WebhookCallError("the AdmissionReview answer has no response")
        return answer


class _WebhookCallError(Exception):
    """A webhook could not be called or answered nonsense (subject to ``failurePolicy``)."""
