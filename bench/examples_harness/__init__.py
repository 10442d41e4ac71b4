"""Helpers of bench/examples.py: stacks, harness patches, mock data, result tables.

Nothing here is imported by the package or by CI; the upstream example sources
are never part of this repository (bench/examples.py takes them from a cache).
"""
