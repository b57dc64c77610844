"""`spot-pipelines providers`: the capacity providers installed here and what each can do.

Every provider, the built-in ones included, is an entry of the ``spot_pipelines.providers``
entry-point group (``spot_core.providers.registry``); this lists each by its registered
name with its declared capabilities and the session it takes, then the interruption
notice detectors (``spot_pipelines.detectors``). With ``--json``: one JSON object,
``providers`` and ``detectors``, each a list.
"""

from __future__ import annotations

import argparse
import json

from spot_core import jobs


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "providers", help="list the installed capacity providers and their capabilities"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    providers = [jobs.provider_plugin(name).describe() for name in jobs.provider_names()]
    detectors = jobs.detectors()
    if args.json:
        print(json.dumps({"providers": providers, "detectors": detectors}, sort_keys=True))
        return 0
    print("providers (entry point group spot_pipelines.providers):")
    for found in providers:
        print(f"  {found['name']:<12} {found['summary']}")
        print(
            f"  {'':<12} capabilities: {', '.join(found['capabilities']) or 'none'}; "
            f"session: {found['session'] or 'none'}; {found['class']}"
        )
    print("notice detectors (entry point group spot_pipelines.detectors):")
    for found in detectors:
        print(f"  {found['name']:<12} {found['summary']}")
    return 0
