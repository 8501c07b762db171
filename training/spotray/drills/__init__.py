"""Fault drills on a real multi-node Ray cluster on this machine."""
