"""The web dashboards."""
