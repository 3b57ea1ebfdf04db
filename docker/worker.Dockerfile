# The GPU worker pods' image (values images.worker; kale.yaml kubernetes.image): kale-airflow with
# the worker, kafka and postgres extras on a CUDA build of torch. The pod runs it non-root
# (runAsUser 1000: kubernetes.run_as_user), with a read-only root filesystem and /tmp as its
# only writable directory (HOME=/tmp). Build from the repository root after `python -m build`:
#   docker build -f docker/worker.Dockerfile -t ghcr.io/kale-airflow/worker:0.1.0 .
# docs/images.md: building, pushing, the tags and what the tests check.
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime

ARG KALE_VERSION=0.1.0
ARG KALE_EXTRAS=worker,kafka,postgres

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

COPY dist/kale_airflow-${KALE_VERSION}-py3-none-any.whl /tmp/kale/

# The base image's torch is pinned (its CUDA build): pip must not replace it with another
# version while resolving torch>=2.4 from the worker extra.
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > /tmp/kale/torch-constraint.txt \
    && python -m pip install --no-cache-dir \
        --constraint /tmp/kale/torch-constraint.txt \
        "/tmp/kale/kale_airflow-${KALE_VERSION}-py3-none-any.whl[${KALE_EXTRAS}]" \
    && rm -rf /tmp/kale \
    && python -m kale_airflow.runtime.worker --help > /dev/null

# uid/gid 1000 with a passwd entry: torch (getpass.getuser) fails for a uid without one.
RUN if ! getent group 1000 > /dev/null; then groupadd --gid 1000 kale; fi \
    && if ! getent passwd 1000 > /dev/null; then \
        useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin kale; fi

ENV HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
USER 1000:1000

# The pods set command and args (python -m kale_airflow.runtime.worker --stream ... --worker-id R):
# this entrypoint is for `docker run IMAGE --help` and the same arguments by hand.
ENTRYPOINT ["python", "-m", "kale_airflow.runtime.worker"]
