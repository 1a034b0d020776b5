from rest_framework.permissions import BasePermission

from runs.domain.roles import is_operator, is_viewer


class IsViewer(BasePermission):
    """Reads: viewers and operators."""

    message = "You need the viewer or operator role."

    def has_permission(self, request, view):
        return is_viewer(request.user)


class IsOperator(BasePermission):
    """Creating and controlling runs: operators only."""

    message = "You need the operator role to control runs."

    def has_permission(self, request, view):
        return is_operator(request.user)
