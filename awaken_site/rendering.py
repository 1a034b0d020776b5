"""No database connection is held while a page renders.

A view reads what its page shows and returns a ``TemplateResponse`` (the pages, the admin,
DRF's answers); this middleware gives the request's connection back to the pool before
that response renders (Django calls ``process_template_response`` between the view and
the rendering). A page of a large run renders for a while; the pool's connection serves
another request meanwhile. A template that still read the database would take one again:
the pages' contexts hold lists, not querysets (``tests/test_pages.py`` checks that no page
queries while it renders).
"""

from django.template.response import TemplateResponse

from runs.workers.broker import release_database


class ReleaseBeforeRender:
    """Django middleware: the connection goes back to the pool before a response renders."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_template_response(self, request, response):
        if isinstance(response, TemplateResponse) and hasattr(request, "user"):
            # A page's header shows its user: read now (session and user), not while it
            # renders. A page that needs no login has not read it yet.
            request.user.is_authenticated  # noqa: B018
        release_database()
        return response
