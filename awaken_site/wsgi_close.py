"""The WSGI application's response is closed after it has been sent.

PEP 3333 has the server call ``close()`` on what the application returned, and Django does its
end-of-request work there: the ``request_finished`` signal, which gives the request's
database connection back to the pool and closes what the request opened. asgiref's
``WsgiToAsgi``, which serves Django under daphne here, iterates the response and never closes
it: without this wrapper every request thread kept its connection, and a burst of requests
ran the pool dry. The wrapper closes the response in the request's own thread as soon as its
last chunk has been taken (or, if the server stops early, as soon as it lets go of it).
"""


def closing(app):
    """The WSGI application ``app``, whose responses are closed once they are sent."""

    def application(environ, start_response):
        response = app(environ, start_response)
        try:
            yield from response
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                close()

    return application
