"""Test helpers shared by several test folders (database pairs, network faults)."""
