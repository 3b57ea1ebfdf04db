"""The retrain/refit task bodies the model DAGs call (forecaster, throughput); MLflow access goes through ``registry``."""
