"""Request counting of the Kubernetes API emulator, served like kube-apiserver's ``/metrics``.

``RequestCounter.record`` counts one resource request by verb (the apiserver's words: GET of one object,
LIST, WATCH, POST, PUT, PATCH, DELETE, DELETECOLLECTION), API group, resource, subresource and client
(the first word of the User-Agent, e.g. ``kopf`` or ``nstance-operator``). ``render`` writes the counts
as the Prometheus text kube-apiserver uses for ``apiserver_request_total`` (plus the ``client`` label,
which the real server does not have); ``parse`` reads that text back into ``RequestKey`` counts, for
benchmarks and tests that count the calls a component makes. Must not: know about any resource's
semantics or keep anything but the counts.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Final, NamedTuple

METRIC: Final = "apiserver_request_total"
_LINE: Final = re.compile(r"^" + METRIC + r"\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9]+)\s*$")
_LABEL: Final = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class RequestKey(NamedTuple):
    """What one counted request was."""

    verb: str
    group: str
    resource: str
    subresource: str
    client: str


def client_of(user_agent: str) -> str:
    """The product name a User-Agent starts with ("" when there is none)."""
    return user_agent.split("/", 1)[0].split(" ", 1)[0].strip()


def verb_of(method: str, *, named: bool, watch: bool) -> str:
    """The apiserver's verb for an HTTP method on a collection (``named`` False) or one object."""
    if method == "GET":
        if watch:
            return "WATCH"
        return "GET" if named else "LIST"
    if method == "DELETE" and not named:
        return "DELETECOLLECTION"
    return method


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


class RequestCounter:
    """Counts of every resource request since the emulator started."""

    def __init__(self) -> None:
        self.counts: Counter[RequestKey] = Counter()

    def record(self, key: RequestKey) -> None:
        self.counts[key] += 1

    def render(self) -> str:
        lines = [
            f"# HELP {METRIC} Requests by verb, group, resource, subresource and client.",
            f"# TYPE {METRIC} counter",
        ]
        for key, count in sorted(self.counts.items()):
            labels = ",".join(f'{name}="{_escape(value)}"' for name, value in key._asdict().items())
            lines.append(f"{METRIC}{{{labels}}} {count}")
        return "\n".join(lines) + "\n"


def parse(text: str) -> Counter[RequestKey]:
    """The ``apiserver_request_total`` counts in a ``/metrics`` text written by ``render``."""
    counts: Counter[RequestKey] = Counter()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        labels = {name: _unescape(value) for name, value in _LABEL.findall(match.group("labels"))}
        key = RequestKey(*(labels.get(field, "") for field in RequestKey._fields))
        counts[key] += int(match.group("value"))
    return counts
