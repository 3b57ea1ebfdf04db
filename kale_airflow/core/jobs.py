"""The name every layer shares for the job of a single-job deployment (a light module: the
worker's and the pool supervisor's processes import it without the configuration's)."""

DEFAULT_JOB = "default"  # the job of a single-job deployment (no job in its DAG ids, models or paths)
