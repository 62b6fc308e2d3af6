"""The trace store and failure analysis: needs `tracegym[analysis]`."""
