"""The ``ragproxy`` command: ``serve``, ``demo``, ``check-config``, ``simulate``, ``calibrate``.

Flags override ``RAGPROXY_*`` environment variables, which override the YAML file given with ``--config``
(or ``RAGPROXY_CONFIG``). ``check-config``, ``serve`` and ``demo`` share one validation (:func:`checked_settings`):
the settings model's rules plus the start-up rule that the admin API must not listen beyond loopback without a
token; whatever ``serve`` refuses, ``check-config`` refuses too, both with exit code 2 and one line naming the key.
An address that cannot be bound, or a data directory another ``serve`` is using, stops ``serve`` with exit code 1
and one line. ``--llm-upstream URL,api_key_env=NAME`` gives the proxy its own key for a hosted upstream from the
environment variable NAME; a key itself (``api_key=``) is refused on the command line, where it would stay in
the shell's history and the process list.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine
from importlib import metadata
from typing import Any

import yaml

from proxy.assembly.config import ConfigError, Settings, load_settings, parse_assignment, redacted
from proxy.kv.kinds import KINDS
from proxy.upstream.settings import LLMBackend, redact_url

LLM_OPTIONS = tuple(name for name in LLMBackend.model_fields if name not in ("url", "api_key"))
"""The options of ``--llm-upstream URL,OPTION=VALUE,...`` (``api_key_env``, never ``api_key``)."""
_REFUSED = {"check-config": "invalid configuration", "serve": "refusing to start", "demo": "refusing to start"}


def _settings_flags(command: argparse.ArgumentParser, *, upstreams: bool) -> None:
    if upstreams:
        command.add_argument("--config", help="YAML config file (default: $RAGPROXY_CONFIG)")
        command.add_argument("--host", help="data-plane bind address (server.host)")
    command.add_argument("--port", help="data-plane port (server.port)")
    if upstreams:
        command.add_argument("--llm-upstream", action="append", metavar="URL[,kind=KIND][,api_key_env=NAME]",
                             help=f"an OpenAI-compatible backend, repeat for replicas (upstreams.llm); options "
                                  f"after commas: kind={'|'.join(KINDS)}, api_key_env= (the environment variable "
                                  "holding the proxy's own key for it), name=, slots=, max_concurrency=, "
                                  "kv_capacity_tokens=")
        command.add_argument("--qdrant-upstream", metavar="URL", help="Qdrant REST URL (upstreams.qdrant.url)")
    command.add_argument("--admin-port", help="admin API port (admin.port)")
    if upstreams:
        command.add_argument("--data-dir", help="directory of the embedded stores (data_dir)")
    command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="any setting by its dotted key, e.g. cache.l1.max_bytes=1000000")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragproxy", description="Caching proxy for RAG applications.")
    parser.add_argument("--version", action="version", version=f"ragproxy {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "start the proxy"), ("check-config", "validate and print the effective config")):
        _settings_flags(commands.add_parser(name, help=text), upstreams=True)
    demo = commands.add_parser("demo", help="start the proxy in front of built-in test upstreams and show its tiers")
    _settings_flags(demo, upstreams=False)
    demo.add_argument("--serve", action="store_true",
                      help="keep the proxy and its test upstreams running for your own requests (Ctrl-C stops)")
    simulate = commands.add_parser("simulate", help="replay a cache trace through eviction policies")
    simulate.add_argument("args", nargs=argparse.REMAINDER)
    calibrate = commands.add_parser("calibrate",
                                        help="L2 thresholds from labelled question pairs (commands.calibrate)")
    calibrate.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _version() -> str:
    try:
        return metadata.version("ragproxy")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def llm_upstream(text: str) -> dict[str, Any]:
    """One ``--llm-upstream URL[,kind=KIND][,name=NAME]...`` → one ``upstreams.llm`` entry."""
    url, *options = text.split(",")
    entry: dict[str, Any] = {"url": url.strip()}
    for option in options:
        key, sep, value = (part.strip() for part in option.partition("="))
        if not sep or key not in LLM_OPTIONS:  # (the value is not shown: it may be a secret)
            hint = " (name the environment variable holding it: api_key_env=NAME)" if key == "api_key" else ""
            raise ConfigError(f"--llm-upstream {redact_url(entry['url'])}: {key!r} is not OPTION=VALUE with an "
                              f"OPTION of {', '.join(LLM_OPTIONS)}{hint}")
        entry[key] = value
    return entry


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for text in args.set:
        key, value = parse_assignment(text)
        overrides[key] = value
    flags = {"server.host": getattr(args, "host", None), "server.port": args.port,
             "upstreams.qdrant.url": getattr(args, "qdrant_upstream", None), "admin.port": args.admin_port,
             "data_dir": getattr(args, "data_dir", None)}
    overrides.update({key: value for key, value in flags.items() if value is not None})
    if getattr(args, "llm_upstream", None):
        overrides["upstreams.llm"] = [llm_upstream(text) for text in args.llm_upstream]
    return overrides


def checked_settings(config_file: str | None, overrides: dict[str, Any]) -> Settings:
    """The settings ``serve`` would run with; :class:`ConfigError` for anything it would refuse."""
    settings = load_settings(config_file or os.environ.get("RAGPROXY_CONFIG"), overrides=overrides)
    problem = settings.admin.bind_problem()
    if problem is not None:
        raise ConfigError(problem)
    return settings


def _run(main: Coroutine[Any, Any, int | None]) -> int:
    """Run ``main`` on uvloop when installed; an address that cannot be bound is one line and exit code 1, credits
    in a Redis that persists nothing one line and exit code 2."""
    from commands.serve import CannotListen, DataDirInUse
    from proxy.core.memory import pin_mmap_threshold
    from proxy.credits.persistence import VolatileCreditStore

    pin_mmap_threshold()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(main) or 0
    except (CannotListen, DataDirInUse) as exc:
        print(f"ragproxy: {exc}", file=sys.stderr)
        return 1
    except VolatileCreditStore as exc:
        print(f"ragproxy: refusing to start: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed (start-up, the demo's tour)
        return 130
    except BrokenPipeError:  # stdout closed early (``ragproxy demo | head``): stop quietly, as a pipeline expects
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit must not fail again
        return 1


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    # simulate and calibrate parse their own arguments (argparse's REMAINDER would swallow neither --help nor options)
    if given[:1] == ["simulate"]:
        from tiers.policies.simulate import main as simulate_main

        return int(simulate_main(given[1:]))
    if given[:1] == ["calibrate"]:
        from commands.calibrate import main as calibrate_main

        return calibrate_main(given[1:])
    args = _parser().parse_args(given)
    demo = None
    try:
        overrides = _overrides(args)
        if args.command == "demo":
            from commands.demo import Demo

            demo = Demo.prepare(overrides, keep_serving=args.serve)
            overrides = demo.overrides
        settings = checked_settings(getattr(args, "config", None), overrides)
    except ConfigError as exc:
        print(f"ragproxy: {_REFUSED[args.command]}: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        sys.stdout.write(yaml.safe_dump(redacted(settings), sort_keys=False))
        return 0
    from commands.serve import serve
    from proxy.observability.logs import configure

    configure(settings.logging.level, settings.logging.format)
    return _run(serve(settings) if demo is None else demo.run(settings))


if __name__ == "__main__":
    raise SystemExit(main())
