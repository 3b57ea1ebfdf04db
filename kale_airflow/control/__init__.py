"""The manager layer (like the Kubernetes provider's ``PodManager``): the flows that
operators, sensors and triggers call. Observe and decide (:mod:`.autoscaler`); apply
decisions, rebalance generations and start their workers (:mod:`.generations`). The
control-plane store they share is the adapter :mod:`kale_airflow.store`."""
