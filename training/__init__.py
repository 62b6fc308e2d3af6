"""LoRA adapters per capability, routing and evaluation (issue 6): needs `tracegym[training]`."""
