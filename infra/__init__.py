"""Where trials physically run: work-pool sizing backends, job templates, AWS calls."""
