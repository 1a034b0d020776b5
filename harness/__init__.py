"""The development harness: the system's processes started as a user would start them
(daphne, Celery workers, the embedded site), for the tests, ``manage.py bench`` and
``manage.py screenshot``."""
