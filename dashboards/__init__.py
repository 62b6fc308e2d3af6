"""The web dashboards (issue 8)."""
