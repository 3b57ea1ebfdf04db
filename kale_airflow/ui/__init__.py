"""The Kale page in the Airflow UI (a FastAPI app served by the Airflow API server)."""
