# ratebeam's one container image: every role (run, serve, events serve, rpc, db upgrade, Dask
# workers), Prism (Beam's portable runner) inside.  docs/deployment.md describes the build
# arguments, the entrypoint, the user and the volume.
#
#   podman build -t ratebeam .        (or docker build: BuildKit or buildah, for the cache mounts)

# A Debian-family image with python3 (>= 3.11) and its venv module.
ARG BASE_IMAGE=python:3.11-slim
# A Go toolchain as recent as Prism's go.mod asks for.
ARG GO_IMAGE=golang:1.25-bookworm

# The base of the Python stages: the extra CAs trusted, tini there.
FROM ${BASE_IMAGE} AS python-base
# A PEM bundle of CAs to trust besides the base image's (a proxy that re-signs TLS), as a path
# inside the build context.  Empty: none.
ARG EXTRA_CA_BUNDLE=""
# tini forwards SIGTERM to ratebeam and reaps what it leaves; a base that has it already keeps it.
RUN --mount=type=bind,target=/context \
    set -eu; \
    if [ -n "$EXTRA_CA_BUNDLE" ]; then \
      cp "/context/$EXTRA_CA_BUNDLE" /usr/local/share/ca-certificates/ratebeam-extra-ca.crt; \
      update-ca-certificates >/dev/null; \
    fi; \
    if ! command -v tini >/dev/null; then \
      apt-get update; \
      apt-get install -y --no-install-recommends tini=0.19.*; \
      rm -rf /var/lib/apt/lists/*; \
    fi
# pip, and requests at run time, trust the system bundle (the extra CAs in it).
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Prism at ratebeam's PRISM_VERSION (pipelines/runners/launch.py says why it is newer than the
# apache-beam SDK; tests/test_image.py checks they agree), from the Go module proxy; static, so it
# runs on any base.
FROM ${GO_IMAGE} AS prism
ARG PRISM_VERSION=2.78.0
COPY --from=python-base /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOBIN=/out GOFLAGS=-buildvcs=false \
      go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v${PRISM_VERSION}"

FROM python-base AS wheel
COPY pyproject.toml README.md /src/
COPY ratebeam /src/ratebeam
COPY pipelines /src/pipelines
COPY transforms /src/transforms
COPY connectors /src/connectors
COPY runner_configs /src/runner_configs
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/build && /opt/build/bin/pip wheel --quiet --no-deps --wheel-dir /dist /src

FROM python-base AS runtime
# The runtime extras (pyproject.toml); `all` serves every role.
ARG EXTRAS=all
# The wheel and its extras at the versions of constraints.txt, in a venv owned by root; then the
# user that runs everything.
COPY constraints.txt /opt/ratebeam-constraints.txt
COPY --from=wheel /dist/ /tmp/dist/
RUN --mount=type=cache,target=/root/.cache/pip \
    set -eu; \
    python3 -m venv /opt/ratebeam; \
    wheel="$(ls /tmp/dist/ratebeam-*.whl)"; \
    /opt/ratebeam/bin/pip install --quiet -c /opt/ratebeam-constraints.txt "${wheel}[${EXTRAS}]"; \
    rm -rf /tmp/dist; \
    groupadd --system --gid 10001 ratebeam; \
    useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ratebeam --create-home ratebeam
COPY --from=prism /out/prism /usr/local/libexec/ratebeam/prism
# `prism: {binary: auto}` takes this Prism when none is on PATH (pipelines/runners/launch.py).
ENV PATH=/opt/ratebeam/bin:$PATH \
    RATEBEAM_PRISM_BINARY=/usr/local/libexec/ratebeam/prism \
    PYTHONUNBUFFERED=1
USER 10001:10001
# The workspace: ratebeam.yaml, metrics.yml, rules, a SQLite database or the embedded store if used.
WORKDIR /var/lib/ratebeam
ENTRYPOINT ["tini", "--", "ratebeam"]
CMD ["--help"]
