"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from kale_airflow import __version__


def get_provider_info() -> dict:
    """Return the provider info dict that Airflow's ProvidersManager expects."""
    return {
        "package-name": "kale-airflow",
        "name": "Kale",
        "description": "Predictive GPU autoscaling for online deep-learning training (Kale, SoCC '24).",
        "versions": [__version__],
    }
