# The image of every Airflow component of the official apache-airflow chart and of its
# KubernetesExecutor task pods (values images.airflow: the chart's defaultAirflowRepository and
# defaultAirflowTag in the values kale-airflow's NOTES print): apache/airflow with kale-airflow
# (provider, DAG helpers, the Kale page) and the DAGs baked into the DAGs folder. Build from
# the repository root after `python -m build`:
#   docker build -f docker/airflow.Dockerfile -t ghcr.io/kale-airflow/airflow:0.1.0 .
# docs/images.md: building, pushing, the tags and what the tests check.
FROM apache/airflow:3.3.2-python3.12

ARG KALE_VERSION=0.1.0
# forecast: the retrain DAG trains NeuralProphet, and the autoscaler's trigger loads it;
# kafka: the stream; postgres: the control-plane database. Not worker: the pods train.
ARG KALE_EXTRAS=forecast,kafka,postgres
# NeuralProphet needs torch: the CPU build, not the multi-GB CUDA one the default index has.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

COPY --chown=airflow:0 dist/kale_airflow-${KALE_VERSION}-py3-none-any.whl constraints.txt /tmp/kale/

# The base image installed Airflow and its providers with Airflow's constraints file; this
# second step follows Airflow's rule for what comes after it: apache-airflow pinned to the
# image's version (no upgrade or downgrade), the constraints file not applied to the rest,
# since the forecast extra caps numpy<2 and pandas<3 (NeuralProphet 0.9) where Airflow's
# constraints may pin newer. constraints.txt pins torch (the version the tests run).
RUN pip install --no-cache-dir \
        --constraint /tmp/kale/constraints.txt \
        --extra-index-url "${TORCH_INDEX_URL}" \
        "apache-airflow==${AIRFLOW_VERSION}" \
        "/tmp/kale/kale_airflow-${KALE_VERSION}-py3-none-any.whl[${KALE_EXTRAS}]" \
    && rm -rf /tmp/kale \
    && kale --version

COPY --chown=airflow:0 dags/ /opt/airflow/dags/
