#!/bin/sh
# Stand-in for the official Prefect image's entrypoint.sh: installs $EXTRA_PIP_PACKAGES
# if given, then runs the command.
set -eu
if [ -n "${EXTRA_PIP_PACKAGES:-}" ]; then
    # shellcheck disable=SC2086  # a list of requirements, split on purpose
    pip install --no-cache-dir $EXTRA_PIP_PACKAGES
fi
exec "$@"
