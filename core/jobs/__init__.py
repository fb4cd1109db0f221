"""Jobs in the background: the worker that claims and executes them, and pausing, resuming, cancelling."""
