"""The development harness: the system's processes started as a user would start them
(daphne, Celery workers, the embedded site), for the tests and ``manage.py bench``."""
