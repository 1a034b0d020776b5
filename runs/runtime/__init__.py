"""Executing runs: cancellation tokens, the active-attempt registry, the agent interface and
the executor that runs attempts on one event loop per worker process."""
