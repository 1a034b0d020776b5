"""Between the web side and the workers: what is sent to a worker, and what a worker does
with the live commands it receives.

* ``dispatch``: hands queued runs and bulk jobs to the workers (Celery task messages) and
  sends a live command to the one worker that holds a run's claim (Celery remote
  control). It is the domain's ``workers`` port; any process that commits a transition
  uses it.
* ``broker``: the few threads of each process that make those broker calls for the rest.
* ``commands``: receives the live commands in a worker process and applies them to the
  attempt in that process's active-attempt registry.
"""
