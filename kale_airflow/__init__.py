"""kale-airflow: predictive GPU autoscaling for online DL training on Airflow 3."""

__version__ = "0.1.0"
