"""``python -m bookie --conf bookie.toml`` (also ``walkit bookie start --conf ...``).

Runs one :class:`~bookie.server.BookieServer` until SIGTERM or SIGINT, then stops it
gracefully (in-flight adds answered, deregistered, checkpointed) and exits 0. Logs go to
stderr. A start that fails (bad configuration, foreign cookie, unusable cluster, bookie
id in use) logs the reason and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from bookie._config import BookieConfig
from walkit.errors import WalkitError

__all__ = ["main", "serve"]

log = logging.getLogger("bookie")


async def serve(config: BookieConfig) -> None:
    from bookie.server import BookieServer

    server = BookieServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: loop.create_task(server.stop()))
    await server.wait_stopped()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conf", required=True, help="bookie configuration (TOML, BookKeeper key names)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s", force=True)
    try:
        config = BookieConfig.from_toml(args.conf)
        asyncio.run(serve(config))
    except WalkitError as exc:
        log.error("bookie failed: %s: %s", type(exc).__name__, exc)
        return 2
    except OSError as exc:  # e.g. the port is taken
        log.error("bookie failed: %s", exc)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookie", description="walkit's storage server")
    add_arguments(parser)
    return run(parser.parse_args(argv))
