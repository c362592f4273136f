"""Infrastructure every service shares: database pools, settings, the gRPC server and its input
checks, the process runtime, LISTEN, background jobs, logs, metrics, traces, the process registry,
embedded and test databases. Nothing here knows a table family or a pack."""
