"""Telemetry: tracing helpers (`tracing`) and metric instruments (`metrics`) over the OTel API, the
SDK and exporters set up once at start (`sdk`), and the `GET /metrics` route (`metrics_route`)."""
