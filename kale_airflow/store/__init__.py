"""The control-plane store: generations and their shard assignments, control keys (the
current generation, the autoscaler's state), and the decision log. Workers, the
triggerer, Airflow workers and the API server all read and write it."""

from kale_airflow.store.state import StateStore

__all__ = ["StateStore"]
