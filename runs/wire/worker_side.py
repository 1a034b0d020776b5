"""The worker side of the wire: live commands arrive here as a Celery remote-control command.

It runs in the worker's main process, where the executor and its active-attempt registry
live, finds the attempt by run id and generation, and answers whether it took the command.
"""

from celery.signals import worker_init
from celery.worker.control import control_command

from runs.runtime.executor import current_executor

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
    executor = current_executor()
    entry = None
    if executor is not None:
        entry = executor.registry.deliver(run_id, generation, command, actor=actor,
                                          source=source)
    return {"delivered": entry is not None, "generation": generation}
