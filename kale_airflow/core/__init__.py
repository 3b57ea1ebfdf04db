"""Pure decision logic: no Airflow, Kubernetes, MLflow or network imports (a test enforces it)."""
