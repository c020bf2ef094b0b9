# syntax=docker/dockerfile:1
#
# Nstance: one image with the four programs - nstance-server (the default entry point), nstance-agent,
# nstance-operator and nstance-admin - installed from the project's wheel into /opt/nstance, run as the
# non-root user nstance (UID/GID 65532, the UID the Helm chart's podSecurityContext uses).
#
#   docker build -t ghcr.io/nstance/nstance:0.1.0 .
#
#   docker run --rm ghcr.io/nstance/nstance:0.1.0 --help                              # nstance-server
#   docker run --rm --entrypoint nstance-agent    ghcr.io/nstance/nstance:0.1.0 --help
#   docker run --rm --entrypoint nstance-operator ghcr.io/nstance/nstance:0.1.0 --help
#   docker run --rm --entrypoint nstance-admin    ghcr.io/nstance/nstance:0.1.0 --help
#
# A shard server on file:// storage kept in a volume (flags also as NSTANCE_* environment variables;
# the SQLite cache goes to NSTANCE_CACHEDIR=/var/cache/nstance):
#
#   docker run -d --name nstance-a -v nstance-data:/var/lib/nstance -p 8990-8994:8990-8994 \
#     ghcr.io/nstance/nstance:0.1.0 --id s1 --shard zone-a --storage file --bucket /var/lib/nstance/storage
#
# Ports the server listens on by default: 8990 health and metrics, 8991 election, 8992 registration,
# 8993 operator API, 8994 agent API. The operator's chart (deploy/helm/nstance-operator) runs this image
# with `command: [nstance-operator]` and a read-only root file system: nothing here writes outside
# /var/lib/nstance, /var/cache/nstance and /tmp at run time (bytecode is compiled at build time).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the wheel, from the package sources only (no tests, no dev dependencies) -------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
# nstance/_migrations is a symlink to ../migrations: both are copied so the wheel ships the migrations.
COPY migrations/ migrations/
COPY nstance/ nstance/
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
    && test -n "$(python -m zipfile -l /dist/nstance-*.whl | grep 'nstance/_migrations/versions/')"

# --- runtime: the wheel and its runtime dependencies in a venv, nothing else ------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="nstance" \
      org.opencontainers.image.description="Nstance: nstance-server, nstance-agent, nstance-operator, nstance-admin" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The venv has no pip of its own: the base image's pip installs the wheel (mounted from the builder,
# so it is not left in a layer) and its runtime dependencies into it, compiled to bytecode.
RUN --mount=type=bind,from=builder,source=/dist,target=/tmp/dist \
    /usr/local/bin/python -m venv --without-pip /opt/nstance \
    && /usr/local/bin/python -m pip --python /opt/nstance/bin/python install --no-cache-dir --compile \
       /tmp/dist/nstance-*.whl

# Upstream's images keep each program at the root and its Helm chart runs `command: /nstance-operator`:
# the same paths here, so this image drops into upstream's chart and units.
RUN for program in nstance-server nstance-agent nstance-operator nstance-admin; do \
        ln -s "/opt/nstance/bin/$program" "/$program" || exit 1; \
    done

RUN groupadd --system --gid 65532 nstance \
    && useradd --system --uid 65532 --gid nstance --home-dir /var/lib/nstance --no-create-home \
       --shell /usr/sbin/nologin nstance \
    && install -d -o nstance -g nstance -m 0750 /var/lib/nstance /var/cache/nstance

ENV PATH=/opt/nstance/bin:$PATH \
    HOME=/var/lib/nstance \
    NSTANCE_CACHEDIR=/var/cache/nstance
USER 65532:65532
WORKDIR /var/lib/nstance

# Fail the build if an entry point or the packaged generated code and migrations are missing.
RUN for program in nstance-server nstance-agent nstance-operator nstance-admin; do \
        "$program" --help > /dev/null || exit 1; \
    done \
    && python -c "import nstance.rpc.operator_pb2_grpc, nstance._migrations"

EXPOSE 8990 8991 8992 8993 8994
ENTRYPOINT ["nstance-server"]
