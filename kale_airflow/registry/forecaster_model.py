"""The forecaster's pyfunc as MLflow "models from code": ``log_model`` is given this file, not a
pickled object, and MLflow runs it to build the model when it logs or loads a version (any
kale-airflow with :class:`~kale_airflow.registry.pyfunc.ForecasterModel` loads it)."""

import mlflow.models

from kale_airflow.registry.pyfunc import ForecasterModel

mlflow.models.set_model(ForecasterModel())
