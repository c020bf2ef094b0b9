"""Command line: run the Kubernetes API emulator as a process (for subprocess-based tests and demos).

``python -m nstance.testing.kubeapi --port 0 --crds DIR_OR_FILE... --kubeconfig OUT`` loads the manifests,
binds 127.0.0.1, writes the kubeconfig if asked, prints one JSON line ``{"url": ..., "port": ...}`` on
stdout once it is listening, and serves until SIGTERM or SIGINT. It must not do anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from nstance.testing.kubeapi.server import KubeAPIServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nstance.testing.kubeapi", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    parser.add_argument("--crds", nargs="*", default=[], help="CRD/manifest files or directories to load")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server to this path")
    parser.add_argument(
        "--bookmark-interval", type=float, default=1.0, help="seconds between watch bookmarks"
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (DEBUG logs every request)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    server = KubeAPIServer(host=args.host, crds=args.crds, bookmark_interval=args.bookmark_interval)
    await server.start(args.port)
    try:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig)
        print(json.dumps({"url": server.url, "port": server.port}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        asyncio.run(serve(args))
    except (OSError, ValueError) as exc:
        print(f"kubeapi emulator: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
