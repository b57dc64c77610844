#!/bin/sh
# Stand-in for the official Airflow image's /entrypoint, the part this project relies on:
# a command that is a program runs as given (`airflow scheduler`, `bash -c ...`), anything
# else is an Airflow subcommand (`scheduler`). It waits for no database and creates no
# user: compose's airflow-init and depends_on do that.
set -eu
if [ "$#" -gt 0 ] && command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec airflow "$@"
