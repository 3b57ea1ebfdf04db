"""Where traffic, lag and throughput history come from (embedded store; Prometheus later)."""
