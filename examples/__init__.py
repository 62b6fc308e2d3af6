"""Bundled example agents: the demo the main job traces."""
