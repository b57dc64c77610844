"""``python -m spot_emulators.kubernetes --workdir DIR [--port 0] [--cluster F]``

Serves until SIGTERM / Ctrl-C, then kills every pod process. Prints one JSON line with
the URL and the kubeconfig path (also written to DIR/emulator.json), e.g. for
``KUBECONFIG=DIR/kubeconfig kubectl get nodes`` or a demo in another process.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from .cluster import KubeCluster
from .config import ClusterConfig


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spot_emulators.kubernetes",
        description="A Kubernetes API emulator whose pods run as local processes; serves "
        "until SIGTERM and prints its URL and kubeconfig path as JSON.",
    )
    parser.add_argument("--workdir", required=True, help="kubeconfig, pod dirs, emulator.json")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--cluster", help="cluster.json: pools, time_scale, timings, images")
    parser.add_argument("--time-scale", type=float, help="overrides the file's time_scale")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        config = ClusterConfig.load(args.cluster) if args.cluster else ClusterConfig()
        if args.time_scale is not None:
            config = ClusterConfig(config.pools, args.time_scale, config.timings, config.images)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = KubeCluster(args.workdir, config, port=args.port).start()
    try:
        info = {
            "url": cluster.url,
            "kubeconfig": str(cluster.kubeconfig_path),
            "nodes": [n["metadata"]["name"] for n in cluster.store.all("nodes")],
        }
        (cluster.workdir / "emulator.json").write_text(json.dumps(info, indent=2))
        print(json.dumps(info), flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
