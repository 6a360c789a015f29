"""The ``packfeed`` command: one entry point, one subcommand per job.

    packfeed pack INPUT... --tokenizer T --seq-len L --output DIR   # pack to Parquet
    packfeed serve INPUT... --tokenizer T --seq-len L --port P      # stream over gRPC
    packfeed train --config run.toml                                # pack and train (Ray Train)
    packfeed inspect DIR                                            # what a packed dir holds

Subcommands are found through the ``packfeed.commands`` entry-point group (pyproject.toml), so
this dispatcher names no subcommand module and the library imports no CLI. A subcommand module
gives ``HELP``, ``ORDER``, ``add_arguments(parser)`` and ``run(args) -> int`` and keeps its
heavy imports inside ``run`` (``packfeed pack`` never imports torch).

Errors (service/errors.py): a user error is one line and exit 2; a bug, a traceback (exit 1);
``--debug`` shows the traceback of a user error too.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

from packfeed.service import faults
from packfeed.service.commands.args import CommandParser, HelpFormatter, configure_logging
from packfeed.service.errors import USER_ERROR_EXIT, user_message
from packfeed.service.cluster.raycluster import Terminated, prepare_ray_env, ray_initialised, shutdown_ray

GROUP = "packfeed.commands"


def commands() -> dict[str, Any]:
    """name -> subcommand module, in their ``ORDER``."""
    found = {ep.name: importlib.import_module(ep.value) for ep in entry_points(group=GROUP)}
    if not found:
        raise RuntimeError(f"no `{GROUP}` entry points: reinstall packfeed (bash deploy/setup.sh)")
    return dict(sorted(found.items(), key=lambda kv: (getattr(kv[1], "ORDER", 99), kv[0])))


def package_version() -> str:
    try:
        return version("packfeed")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, every subcommand included (tests parse entrypoints with it)."""
    parser = CommandParser(prog="packfeed", description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"packfeed {package_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in commands().items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of user errors too")
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status. Ray started by the command is shut down
    before returning; a Ray the caller had already initialised is left running. Without
    ``argv`` it is the process's own command line (the ``packfeed`` executable, ``python -m
    packfeed.service.cli``): the process then ends here (``exit_without_teardown``)."""
    code = run_command(sys.argv[1:] if argv is None else argv)
    if argv is None:
        exit_without_teardown(code)
    return code


def run_command(argv: list[str]) -> int:
    """``main``'s work: parse, run, report, shut this command's Ray down; the exit status."""
    prepare_ray_env()  # before anything imports Ray
    callers_ray = ray_initialised()
    args = build_parser().parse_args(argv)
    configure_logging(args.command, args.debug)
    try:
        _announce_faults()
        return args.run(args)
    except KeyboardInterrupt:
        print(f"packfeed {args.command}: interrupted", file=sys.stderr, flush=True)
        return 130
    except Terminated:
        print(f"packfeed {args.command}: stopped by SIGTERM", file=sys.stderr, flush=True)
        return 143
    except Exception as exc:
        message = user_message(exc)
        if message is None or args.debug:
            raise
        print(f"packfeed {args.command}: error: {message}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    finally:
        if not callers_ray:
            with _signals_ignored():  # a second SIGTERM or Ctrl-C must not cut the shutdown short
                shutdown_ray()  # in order, before the interpreter's exit hooks run


def exit_without_teardown(code: int) -> None:
    """End the process with ``code`` now that the command is done, skipping the interpreter's
    teardown; return (the usual exit follows) where that teardown still has work to do.

    After ``packfeed pack`` (Ray shut down, its processes reaped) Python's exit took 1.0 s more:
    the exit hooks 0.01 s, then no system call for 1.0 s (strace) while the interpreter freed
    the modules of torch, transformers, Ray and pyarrow object by object. What that teardown
    is for is done here first: the exit hooks (logging's flush, temporary directories'
    finalizers, Ray's, coverage's) and a flush of stdout and stderr; then ``os._exit``. Every
    file packfeed writes is closed by then (``with`` blocks, the writers' ``close``). Not
    while a Ray is up (a caller's) or a thread the interpreter would wait for still runs."""
    if ray_initialised() or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                                if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # a closed pipe, as `packfeed inspect | head`: Python's exit reports it
        return
    os._exit(code)


def _announce_faults() -> None:
    """$PACKFEED_FAULTS checked before anything starts, and said loudly: a drill, not a bug."""
    planned = faults.configured()
    if planned:
        names = ", ".join(f"{p}:{at}" + ("" if rank is None else f"@{rank}") + f":{action}" for p, at, rank, action in planned)
        logging.getLogger("packfeed").warning("fault injection on ($%s): %s", faults.FAULTS_ENV, names)


@contextlib.contextmanager
def _signals_ignored():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
