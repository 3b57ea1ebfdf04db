"""Where traffic, lag and throughput history come from (the embedded store, or Prometheus)."""
