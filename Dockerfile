# The gputopo image for those with a container daemon and a registry:
#   docker build -t ghcr.io/gputopo/gputopo:0.1.0 .
# Without either, `make image` builds the same image from Debian's archive (scripts/build-image.sh:
# mmdebstrap + umoci, an OCI layout). Both: Debian bookworm's python3 (3.11), the project in
# /opt/gputopo with the `cuda` extra (cuda-bindings, for the exporter's copy probes), user 65532,
# entrypoint gputopo. One tag for every manifest: the version in
# pyproject.toml.
FROM debian:bookworm-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python3 -m venv /opt/gputopo \
    && /opt/gputopo/bin/pip install --no-cache-dir --no-compile '/src[cuda]' \
    && find /opt/gputopo -name __pycache__ -type d -prune -exec rm -rf {} +

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && echo 'gputopo:x:65532:65532:gputopo:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'gputopo:x:65532:' >> /etc/group
COPY --from=build /opt/gputopo /opt/gputopo
ENV PATH=/opt/gputopo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 65532:65532
ENTRYPOINT ["/opt/gputopo/bin/gputopo"]
CMD ["--help"]
