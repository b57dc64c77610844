# Stand-in for prefecthq/prefect:VERSION-python3.11, for machines that cannot pull it: the
# official image's layout (prefect in the image's Python, WORKDIR /opt/prefect, tini -g as
# PID 1 in front of /opt/prefect/entrypoint.sh, running as root) on the Python stand-in,
# with prefect pinned by uv.lock (constraints.txt, exported by make images).
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG PREFECT_VERSION
ENV LC_ALL=C.UTF-8
COPY constraints.txt /tmp/constraints.txt
COPY prefect-entrypoint.sh /opt/prefect/entrypoint.sh
RUN --mount=type=secret,id=ca-bundle,mode=0444 \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir --quiet --constraint /tmp/constraints.txt \
        "prefect==${PREFECT_VERSION}" \
    && chmod 0755 /opt/prefect/entrypoint.sh && rm /tmp/constraints.txt
WORKDIR /opt/prefect
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/opt/prefect/entrypoint.sh"]
