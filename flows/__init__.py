"""Prefect flows: thin drivers of the planners' schedulers against real task runs."""
