"""Telemetry: tracing helpers (`tracing`) and metric instruments (`metrics`) over the OTel API, the
SDK and exporters set up once at start (`sdk`), the `GET /metrics` route (`metrics_route`),
bounded metric label values (`labels`) and the log filter that keeps header values out of logs
(`logs`)."""
