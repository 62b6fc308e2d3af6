"""The trace store and failure analysis (issues 3 and 4): needs `tracegym[analysis]`."""
