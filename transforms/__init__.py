"""Beam PTransforms composed from formats/: read, video, stats, write."""
