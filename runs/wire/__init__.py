"""The wire between web and worker processes, one module for each side of it.

* ``web_side``: hands queued runs to the workers (Celery task messages) and sends a live
  command to the one worker that holds a run's claim (Celery remote control). It is the
  domain's ``workers`` port; any process that commits a transition uses it.
* ``worker_side``: receives those live commands in a worker process and finds the attempt
  in that process's active-attempt registry.
"""
