"""Planning: pure Python (no Prefect, no MLflow, no I/O), testable in milliseconds."""
