"""The `interlock` command: parse arguments, call into the library, print the cause on failure."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

from policies.config_errors import ConfigError
from policies.model import Config, LedgerSettings
from proxy.ops.config_child import load_config_in_child
from proxy.ops.ledger_cli import add_ledger_parser, run_ledger_command

__all__ = ["main"]

log = logging.getLogger("interlock")


def _default_config() -> str:
    return os.environ.get("INTERLOCK_CONFIG", "interlock.yaml")


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        dest="config",
        default=None,
        help="configuration file (default: $INTERLOCK_CONFIG, else ./interlock.yaml)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interlock",
        description="Interlock: backpressure, a side-effect ledger and telemetry for AI agents.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the proxy")
    _add_config_option(serve)
    serve.add_argument(
        "--loop",
        choices=LOOPS,
        default=None,
        help="event loop: uvloop where installed (auto, the default), or the standard asyncio "
        "loop (default: $INTERLOCK_LOOP, else auto)",
    )

    check = commands.add_parser("check-config", help="validate a config, print the policy")
    check.add_argument("file", nargs="?", default=None, help="configuration file")
    _add_config_option(check)

    demo = commands.add_parser("demo", help="the guided demo behind `make demo`")
    _add_config_option(demo)
    demo.add_argument("--keep", action="store_true", help="keep the demo's temporary folder")

    add_ledger_parser(commands)
    return parser


LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for `choice` (None: the standard asyncio loop).

    Raises:
        ValueError: an unknown choice, or `uvloop` asked for where it is not installed.
    """
    if choice not in LOOPS:
        raise ValueError(f"unknown event loop {choice!r} (one of {', '.join(LOOPS)})")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError("the uvloop event loop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _config_path(args: argparse.Namespace) -> str:
    return getattr(args, "file", None) or args.config or _default_config()


def ledger_settings(args: argparse.Namespace) -> LedgerSettings:
    """`--ledger-url` / `INTERLOCK_LEDGER_URL` win; otherwise the config file's ledger section."""
    url = getattr(args, "ledger_url", None) or os.environ.get("INTERLOCK_LEDGER_URL")
    if url:
        return LedgerSettings(url=url)
    from policies.config import load_config  # a short-lived command: it validates in-process

    return load_config(_config_path(args)).ledger


async def _serve(config: Config) -> None:
    from proxy.app import create_app  # imported here: the ledger command must not need aiohttp app
    from proxy.listener import start_runner
    from proxy.runtime.heap import settle_after_start
    from proxy.state import LEDGER

    app = create_app(config)
    # A ledger that is behind is migrated by a child process: the migration tool then never
    # enters this long-lived process's memory (if the child fails, the open migrates here).
    app[LEDGER].migrate_in_child = True
    # No access log: every call is a span and a metric already, and the log line costs ~10 % CPU.
    runner = await start_runner(
        app,
        config,
        config.listen_host,
        config.listen_port,
        handle_signals=False,
        shutdown_timeout=config.shutdown_grace_s,
        access_log=None,
    )
    addresses = ", ".join(f"http://{host}:{port}" for host, port, *_ in runner.addresses)
    settle_after_start()
    loop_name = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print(f"interlock: listening on {addresses} ({loop_name} event loop)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("interlock: stopping: no new calls admitted, draining in-flight calls", flush=True)
    await runner.cleanup()
    print("interlock: stopped", flush=True)


def _cmd_serve(args: argparse.Namespace) -> int:
    from proxy.telemetry.logs import install_log_filters
    from proxy.telemetry.sdk import configure_telemetry

    install_log_filters()

    # Validated by a child: the validation's libraries stay out of this long-lived process.
    config = load_config_in_child(_config_path(args))
    try:
        factory = loop_factory(args.loop or os.environ.get("INTERLOCK_LOOP", "auto"))
    except ValueError as exc:
        print(f"interlock: {exc}", file=sys.stderr)
        return 2
    telemetry = configure_telemetry(config.telemetry, enabled=config.telemetry.enabled)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(config))
    finally:
        telemetry.shutdown()
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    from policies.config import load_config
    from proxy.ops.policy_report import print_policy

    path = _config_path(args)
    config = load_config(path)
    print_policy(config)
    print(f"{path}: OK")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from proxy.ops.demo import run_demo

    return run_demo(keep=args.keep)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    default_level = "WARNING" if args.command == "demo" else "INFO"
    logging.basicConfig(
        level=os.environ.get("INTERLOCK_LOG_LEVEL", default_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "serve":
            return _cmd_serve(args)
        if args.command == "check-config":
            return _cmd_check_config(args)
        if args.command == "demo":
            return _cmd_demo(args)
        status: int = run_ledger_command(args, ledger_settings(args))
        return status
    except ConfigError as exc:
        print(f"interlock: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the top-level handler: print the cause, exit non-zero
        print(f"interlock: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
