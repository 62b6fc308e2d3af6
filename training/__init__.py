"""LoRA adapters per capability, routing and evaluation: needs `tracegym[training]`."""
