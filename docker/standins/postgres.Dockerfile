# Stand-in for postgres:VERSION-bookworm, for machines that cannot pull it: Debian
# bookworm's PostgreSQL server (the rootfs comes from `mmdebstrap --variant=minbase`;
# bookworm ships one major version, see the image's labels) behind an entrypoint that
# honours what the official one does for this project: POSTGRES_USER, POSTGRES_PASSWORD,
# POSTGRES_DB, /docker-entrypoint-initdb.d/*.sql on an empty PGDATA, then `postgres`
# listening on every address with scram-sha-256 passwords.
FROM scratch
ADD rootfs.tar /
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
# Debian's package made a cluster of its own at install: the entrypoint makes the one
# the container uses, in PGDATA (a volume, owned by postgres like this folder).
RUN rm -rf /var/lib/postgresql/*/main /etc/postgresql/*/main \
    && ln -s "$(ls -d /usr/lib/postgresql/*/bin)" /usr/lib/postgresql/bin \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres -m 2775 /var/run/postgresql \
    && install -d -m 0755 /docker-entrypoint-initdb.d \
    && chmod 0755 /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
