"""An example of bringing your own model to kale-airflow: temperature sensors report their
last hour of readings, a small MLP forecasts the next one.

- :mod:`.wire`: the payload format (a 59-byte struct per sample),
- :mod:`.producer`: synthetic readings, and ``python -m kale_example_sensor.producer``,
- :mod:`.trainer`: the model and its :class:`~kale_airflow.runtime.trainer.Trainer`.
"""
