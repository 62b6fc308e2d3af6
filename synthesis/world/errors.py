"""Errors and names every part of the simulated world shares."""

from __future__ import annotations

MEMORY_SEARCH = "search_memory"
MEMORY_UPDATE = "update_memory"
# Names for entities only where the traces recorded none at the label path (`WorldBuilder`):
# wherever they recorded names, only those are used.
FALLBACK_LABELS = (
    "Headphones",
    "Keyboard",
    "Monitor",
    "Desk Lamp",
    "Webcam",
    "Charger",
    "Backpack",
    "Kettle",
    "Blender",
    "Tablet",
    "Smart Watch",
    "Speaker",
    "Printer",
    "Router",
    "Camera",
    "Jacket",
    "Sneakers",
    "Water Bottle",
    "Notebook",
    "Office Chair",
    "Air Purifier",
    "Coffee Maker",
    "Hiking Boots",
    "Sunglasses",
    "Yoga Mat",
    "Toaster",
    "Microphone",
    "Power Bank",
    "Drone",
    "Bookshelf",
    "Tent",
    "Skateboard",
    "Wall Clock",
    "Fan",
    "Electric Toothbrush",
    "Gaming Mouse",
)
LABEL_NAMES = ("name", "item", "title", "product", "product_name", "label", "description")


class NotSynthesizable(ValueError):
    """The gap's tools cannot be turned into this family's environment (the message says why)."""


class ToolError(Exception):
    """A tool call that fails; `invalid` marks invalid invocations (schema violations)."""

    def __init__(self, message: str, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid
