"""Reading Kubernetes manifests (YAML or JSON, multi-document) from files and directories.

Used to load CRDs and other objects into the emulator. PyYAML is imported lazily (it comes with kopf
and kubernetes_asyncio) so importing the emulator never requires it. It must not talk to a server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
_SUFFIXES = (".yaml", ".yml", ".json")


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named by ``paths``; directories add their ``*.yaml``/``*.yml``/``*.json`` files (recursive)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"manifest path {path} does not exist")
    return found


def load_manifests(paths: Iterable[str | Path]) -> list[JSON]:
    """All objects in the files (``List`` kinds are flattened; empty documents skipped)."""
    documents: list[JSON] = []
    for path in manifest_files(paths):
        text = path.read_text()
        if path.suffix == ".json":
            loaded: list[Any] = [json.loads(text)]
        else:
            import yaml

            try:
                loaded = list(yaml.safe_load_all(text))
            except yaml.YAMLError as exc:
                raise ValueError(f"{path}: not valid YAML: {exc}") from None
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ValueError(f"{path}: every document must be a mapping, got {type(doc).__name__}")
            if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
                documents.extend(item for item in doc["items"] if isinstance(item, dict))
            else:
                documents.append(doc)
    return documents
