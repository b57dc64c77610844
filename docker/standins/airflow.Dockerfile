# Stand-in for apache/airflow:VERSION-python3.11, for machines that cannot pull it: the
# official image's layout (user airflow, UID 50000, GID 0; AIRFLOW_HOME=/opt/airflow;
# packages under /home/airflow/.local; dumb-init as PID 1; curl) on the Python stand-in,
# with apache-airflow and the providers this project uses pinned by uv.lock
# (constraints.txt, exported by make images).
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG AIRFLOW_VERSION
ENV AIRFLOW_VERSION=${AIRFLOW_VERSION} \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW_UID=50000 \
    PATH=/home/airflow/.local/bin:/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY constraints.txt /tmp/constraints.txt
COPY airflow-entrypoint.sh /entrypoint
# The machine's CA bundle, where a TLS-inspecting proxy needs one (never kept in a layer).
RUN --mount=type=secret,id=ca-bundle,mode=0444 \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends dumb-init curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 50000 --gid 0 --home-dir /home/airflow --create-home airflow \
    && python -m venv /home/airflow/.local \
    && /home/airflow/.local/bin/pip install --no-cache-dir --quiet --constraint /tmp/constraints.txt \
        "apache-airflow==${AIRFLOW_VERSION}" apache-airflow-providers-amazon \
        apache-airflow-providers-cncf-kubernetes psycopg2-binary asyncpg \
    && install -d -o 50000 -g 0 -m 0775 /opt/airflow /opt/airflow/dags /opt/airflow/logs \
    && chown -R 50000:0 /home/airflow && chmod 0755 /entrypoint && rm /tmp/constraints.txt
USER 50000
WORKDIR /opt/airflow
EXPOSE 8080
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/entrypoint"]
CMD ["--help"]
