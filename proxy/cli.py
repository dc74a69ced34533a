"""The ``ragproxy`` command: ``serve``, ``check-config``, ``simulate``, ``calibrate``.

Flags override ``RAGPROXY_*`` environment variables, which override the YAML file given with ``--config``
(or ``RAGPROXY_CONFIG``). An invalid configuration exits with code 2 and one line naming the key.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import yaml

from proxy.config import ConfigError, Settings, load_settings, parse_assignment, redacted


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragproxy", description="Caching proxy for RAG applications.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "start the proxy"), ("check-config", "validate and print the effective config")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--config", help="YAML config file (default: $RAGPROXY_CONFIG)")
        command.add_argument("--host", help="data-plane bind address (server.host)")
        command.add_argument("--port", help="data-plane port (server.port)")
        command.add_argument("--llm-upstream", action="append", metavar="URL",
                             help="an OpenAI-compatible backend; repeat for replicas (upstreams.llm)")
        command.add_argument("--qdrant-upstream", metavar="URL", help="Qdrant REST URL (upstreams.qdrant.url)")
        command.add_argument("--admin-port", help="admin API port (admin.port)")
        command.add_argument("--data-dir", help="directory of the embedded stores (data_dir)")
        command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                             help="any setting by its dotted key, e.g. cache.l1.max_bytes=1000000")
    simulate = commands.add_parser("simulate", help="replay a cache trace through eviction policies")
    simulate.add_argument("args", nargs=argparse.REMAINDER)
    calibrate = commands.add_parser("calibrate", help="L2 thresholds from labelled question pairs (proxy.calibrate)")
    calibrate.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for text in args.set:
        key, value = parse_assignment(text)
        overrides[key] = value
    flags = {"server.host": args.host, "server.port": args.port, "upstreams.qdrant.url": args.qdrant_upstream,
             "admin.port": args.admin_port, "data_dir": args.data_dir}
    overrides.update({key: value for key, value in flags.items() if value is not None})
    if args.llm_upstream:
        overrides["upstreams.llm"] = [{"url": url} for url in args.llm_upstream]
    return overrides


def settings_from_args(args: argparse.Namespace) -> Settings:
    return load_settings(args.config or os.environ.get("RAGPROXY_CONFIG"), overrides=_overrides(args))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        from tiers.policies.simulate import main as simulate_main

        return int(simulate_main(args.args))
    if args.command == "calibrate":
        from proxy.calibrate import main as calibrate_main

        return calibrate_main(args.args)
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"ragproxy: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        sys.stdout.write(yaml.safe_dump(redacted(settings), sort_keys=False))
        return 0
    from proxy.logs import configure
    from proxy.serve import serve

    configure(settings.logging.level, settings.logging.format)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(settings))
    except OSError as exc:
        print(f"ragproxy: cannot start: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
