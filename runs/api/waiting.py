"""Answer a control request with committed state, waiting up to ``wait`` seconds for it."""

from runs import selectors


def wait_for_end(run_id, wait: float):
    """The run as committed now (the live wait arrives with remote delivery)."""
    return selectors.run_get(run_id)
