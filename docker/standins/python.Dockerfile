# Stand-in for the official python image, for machines that cannot pull it (make images
# builds it only then, and labels it as a stand-in): Debian bookworm's python3 (the
# rootfs comes from `mmdebstrap --variant=minbase`), with `python` and `pip` from a
# virtual environment first on PATH, as the official image has them in /usr/local/bin.
FROM scratch
ADD rootfs.tar /
RUN python3 -m venv /opt/python
ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
CMD ["python"]
