"""Observability, the top layer: metrics, the HTTP server, the dashboard and traces."""
