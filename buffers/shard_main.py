"""Run one buffer shard as a plain OS process (no Ray): for tests and benchmarks.

    python -m streamrl.buffers.shard_main --shard-id 0 --log-dir RUN/buffer \
        --config '{"capacity": 1024}'

Prints one JSON line with the endpoints (``{"ingest": ..., "requests": ..., "pid": ...}``)
once the sockets are bound, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

import msgspec

from streamrl.config import BufferConfig

from .server import BufferShard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shard-id", type=int, default=0)
    parser.add_argument("--log-dir", type=Path, default=None, help="durable log directory")
    parser.add_argument("--config", default="{}", help="BufferConfig fields as JSON")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = msgspec.json.decode(args.config, type=BufferConfig)
    shard = BufferShard(config, args.shard_id, log_dir=args.log_dir)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: shard.stop())
    endpoints = {
        "ingest": shard.ingest_endpoint,
        "requests": shard.request_endpoint,
        "pid": os.getpid(),
    }
    print(json.dumps(endpoints), flush=True)
    try:
        shard.serve()
    finally:
        shard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
