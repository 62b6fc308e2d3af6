"""Deterministic failure detectors; see base.py for the interface."""
