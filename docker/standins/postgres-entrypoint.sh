#!/bin/sh
# Stand-in for the official postgres image's docker-entrypoint.sh (the parts compose uses).
set -eu
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
shift
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD: the superuser's password}"
    user="${POSTGRES_USER:-postgres}"
    database="${POSTGRES_DB:-$user}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --auth-local=trust \
        --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    # A server only this script reaches (no TCP) while the database is prepared.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$database" != postgres ]; then
        # psql quotes the name (:"db"); it interpolates variables read from stdin only.
        echo 'CREATE DATABASE :"db";' | psql -v ON_ERROR_STOP=1 -X -q -U "$user" \
            -d postgres -v db="$database"
    fi
    for script in /docker-entrypoint-initdb.d/*; do
        case "$script" in
            *.sql) psql -v ON_ERROR_STOP=1 -X -q -U "$user" -d "$database" -f "$script" ;;
            *.sh) . "$script" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -c listen_addresses='*' "$@"
