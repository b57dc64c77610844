# Stand-in for motoserver/moto:VERSION, for machines that cannot pull it: moto's server
# (moto[server], pinned by uv.lock: constraints.txt) on the Python stand-in, listening on
# 5000 like the official image.
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG MOTO_VERSION
COPY constraints.txt /tmp/constraints.txt
RUN --mount=type=secret,id=ca-bundle,mode=0444 \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && pip install --no-cache-dir --quiet --constraint /tmp/constraints.txt \
        "moto[server]==${MOTO_VERSION}" \
    && rm /tmp/constraints.txt
EXPOSE 5000
ENTRYPOINT ["moto_server", "-H", "0.0.0.0"]
