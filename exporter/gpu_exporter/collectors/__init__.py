"""One prometheus_client collector per concern; see each module."""
