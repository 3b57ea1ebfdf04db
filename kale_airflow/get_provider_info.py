"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from kale_airflow import __version__


def get_provider_info() -> dict:
    """Return the provider info dict that Airflow's ProvidersManager expects."""
    return {
        "package-name": "kale-airflow",
        "name": "Kale",
        "description": "Predictive GPU autoscaling for online deep-learning training (Kale, SoCC '24).",
        "versions": [__version__],
        "plugins": [{"name": "kale", "plugin-class": "kale_airflow.ui.plugin.KalePlugin"}],
        "triggers": [{"integration-name": "Kale", "python-modules": ["kale_airflow.triggers.scaling"]}],
        "operators": [{"integration-name": "Kale", "python-modules": ["kale_airflow.operators.rebalance",
                                                                      "kale_airflow.operators.scale"]}],
        "sensors": [{"integration-name": "Kale", "python-modules": ["kale_airflow.sensors.scaling"]}],
        "hooks": [{"integration-name": "Kale", "python-modules": ["kale_airflow.registry.connection",
                                                                  "kale_airflow.stream.connection"]}],
        "connection-types": [{"connection-type": "kale_mlflow",
                              "hook-class-name": "kale_airflow.registry.connection.KaleMlflowHook"},
                             {"connection-type": "kale_kafka",
                              "hook-class-name": "kale_airflow.stream.connection.KaleKafkaHook"}],
    }
