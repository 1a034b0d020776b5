"""The worker side of live delivery: a Celery remote-control command.

It runs in the worker's main process, where the executor and its registry live, and
answers whether the named attempt took the command.
"""

from celery.signals import worker_init
from celery.worker.control import control_command

# The node name this process's worker answers to: the destination of live commands.
node_name: str | None = None


@worker_init.connect
def remember_node_name(sender, **kwargs):
    global node_name
    node_name = sender.hostname


@control_command(
    args=[("run_id", str), ("generation", int), ("command", str), ("actor", str),
          ("source", str)],
    signature="<run_id> <generation> <cancel|pause|wake> [actor] [source]",
)
def awaken_deliver(state, run_id, generation, command, actor=None, source=None):
    from runs.runtime.executor import current_executor

    executor = current_executor()
    entry = None
    if executor is not None:
        entry = executor.registry.deliver(run_id, generation, command, actor=actor,
                                          source=source)
    return {"delivered": entry is not None, "generation": generation}
