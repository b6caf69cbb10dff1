"""Prefect tasks: one unit of work each (train a segment, track it)."""
