"""What the proxy tells its operators: Prometheus metrics, cache statistics, traces, logs, and the observers that
feed them from each finished request."""
