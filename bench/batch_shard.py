"""A plain batch shard: every item of shard i of n from the first, output at the end.

What a mapped task does today: a reclaim kills it and its next attempt starts the shard
again from item 0 (the baseline of ``bench/batch.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spot_core.workloads.batch_inference import infer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    size = -(-args.items // args.shards)
    items = range(args.shard * size, min(args.items, (args.shard + 1) * size))
    outputs = [infer(i) for i in items]
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(outputs))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
