"""The Content-Security-Policy header of every answer.

The policy is the same for every answer: the pages run no inline script, so there is no
nonce, and no view changes it. The header is therefore made once, when the middleware is
made, from ``SECURE_CSP`` (each directive's name and its sources, in the shape of Django
6.0's setting of that name, whose own middleware can take this one's place then), and
each answer gets that one string. Django's debug pages (a 404 or a 500 with ``DEBUG`` on)
are left without it: they style themselves inline.
"""

from django.conf import settings

HEADER = "Content-Security-Policy"


def policy_header(directives: dict[str, list[str]]) -> str:
    """The header's value: ``name source source; name source ...`` in the given order."""
    return "; ".join(" ".join((name, *sources)) for name, sources in directives.items())


class ContentSecurityPolicy:
    """Django middleware: the site's policy on every answer that has none of its own."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.header = policy_header(settings.SECURE_CSP)

    def __call__(self, request):
        response = self.get_response(request)
        if HEADER not in response.headers and not (
                response.status_code in (404, 500) and settings.DEBUG):
            response.headers[HEADER] = self.header
        return response
