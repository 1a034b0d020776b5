"""Review links: operators make, list and revoke them; a reviewer with the link, and no
account, opens it and answers (``runs.domain.review``)."""

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.api.permissions import IsOperator
from runs.api.serializers import (
    ActionSerializer,
    ErrorSerializer,
    NoBodySerializer,
    StrictSerializer,
)
from runs.api.views import ERRORS, OperatorPostMixin, actor, validated
from runs.domain import review
from runs.domain.representation import action_data, when
from runs.models import LinkState

LINK_STATES = [*LinkState.values, "expired"]


def link_data(link) -> dict:
    return {"id": str(link.id), "run_id": str(link.run_id), "ticket_id": str(link.ticket_id),
            "state": link.status, "created_by": link.created_by,
            "created_at": when(link.created_at), "expires_at": when(link.expires_at),
            "closed_at": when(link.closed_at), "closed_by": link.closed_by}


class ReviewLinkSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    ticket_id = serializers.UUIDField(help_text="The one ticket the link answers.")
    state = serializers.ChoiceField(choices=LINK_STATES,
                                    help_text="expired: open, but past its time.")
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)
    closed_by = serializers.CharField(
        allow_null=True, help_text="The reviewer who used it, or the operator who revoked it.")


class NewReviewLinkSerializer(ReviewLinkSerializer):
    url = serializers.URLField(help_text="The link to send; shown this once.")


class ReviewLinkListSerializer(serializers.Serializer):
    results = ReviewLinkSerializer(many=True)


class ReviewLinkCreateSerializer(StrictSerializer):
    expires_in = serializers.IntegerField(
        required=False, min_value=review.MIN_SECONDS, max_value=review.MAX_SECONDS,
        help_text="Seconds the link lasts (60 to 604800); AWAKEN_REVIEW_LINK_SECONDS if "
                  "not given.")


class ReviewSerializer(serializers.Serializer):
    agent = serializers.CharField()
    reason = serializers.CharField(help_text="approval, input or manual_pause.")
    prompt = serializers.JSONField(allow_null=True, help_text="What the agent asks.")
    schema = serializers.JSONField(allow_null=True,
                                   help_text="JSON Schema the answer's input must satisfy.")
    expires_at = serializers.DateTimeField()
    action = ActionSerializer(allow_null=True,
                              help_text="The one tool call the approval is for: what will run.")


class ReviewAnswerSerializer(StrictSerializer):
    name = serializers.CharField(max_length=review.MAX_NAME_LENGTH,
                                 help_text="The reviewer's name, recorded as the actor.")
    decision = serializers.ChoiceField(
        choices=["approve", "reject"], required=False,
        help_text='For an approval: the input {"approved": true} or {"approved": false}.')
    arguments = serializers.DictField(
        child=serializers.JSONField(), required=False,
        help_text="With decision approve, for a ticket bound to an action: the edited "
                  "arguments to run instead.")
    reason = serializers.CharField(
        required=False, max_length=500, help_text="With decision reject: why.")
    digest = serializers.CharField(
        required=False, max_length=64,
        help_text="With a decision: the digest of the action decided on; another than the "
                  "ticket's is 409 ticket_mismatch.")
    input = serializers.JSONField(required=False, allow_null=True,
                                  help_text="The resume input (not with decision).")

    def validate(self, data):
        if "decision" in data and "input" in data:
            raise serializers.ValidationError("Give a decision or an input, not both.")
        if "decision" not in data and {"arguments", "reason", "digest"} & set(data):
            raise serializers.ValidationError(
                "arguments, reason and digest go with a decision.")
        if data.get("decision") == "reject" and "arguments" in data:
            raise serializers.ValidationError("A rejection runs nothing: no arguments.")
        return data

    @staticmethod
    def resume_input(data):
        """The resume input the answer makes: the input, or the decision's."""
        if "decision" not in data:
            return data.get("input")
        value = {"approved": data["decision"] == "approve"}
        value.update({key: data[key] for key in ("arguments", "reason", "digest")
                      if key in data})
        return value


class ReviewAnsweredSerializer(serializers.Serializer):
    resumed = serializers.BooleanField()


REVIEW_ERRORS = {400: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer,
                 410: ErrorSerializer}


class ReviewLinksView(OperatorPostMixin, APIView):
    @extend_schema(operation_id="runs_review_links_list",
                   responses={200: ReviewLinkListSerializer, **ERRORS})
    def get(self, request, run_id):
        """The review links made for the run, newest first (their tokens are not kept)."""
        return Response({"results": [link_data(link)
                                     for link in review.review_links(run_id=run_id)]})

    @extend_schema(operation_id="runs_review_links_create", request=ReviewLinkCreateSerializer,
                   responses={201: NewReviewLinkSerializer, **ERRORS})
    def post(self, request, run_id):
        """A single-use link that answers the awaiting run's open ticket, for a reviewer
        without an account; its url is shown this once. 409 ``not_awaiting`` when the run
        has no open ticket."""
        data = validated(ReviewLinkCreateSerializer, request)
        seconds = data.get("expires_in") or min(settings.AWAKEN_REVIEW_LINK_SECONDS,
                                                review.MAX_SECONDS)
        link, token = review.review_link_create(run_id=run_id, actor=actor(request),
                                                seconds=seconds)
        return Response({**link_data(link),
                         "url": request.build_absolute_uri(f"/review/{token}/")},
                        status=status.HTTP_201_CREATED)


class ReviewLinkRevokeView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="runs_review_links_revoke", request=None,
                   responses={200: ReviewLinkSerializer, 410: ErrorSerializer, **ERRORS})
    def post(self, request, run_id, link_id):
        """Withdraw a link: it can no longer be opened or used. 410 ``link_used`` if a
        reviewer already used it."""
        validated(NoBodySerializer, request)
        link = review.review_link_revoke(run_id=run_id, link_id=link_id, actor=actor(request))
        return Response(link_data(link))


class ReviewView(APIView):
    """The link itself: whoever holds it, with no account."""

    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="review_retrieve", auth=[],
                   responses={200: ReviewSerializer, **REVIEW_ERRORS})
    def get(self, request, token):
        """What the reviewer is asked: the run's agent, the ticket's prompt and the action
        it is bound to, nothing else. 404 for an unknown link; 410 ``link_expired``,
        ``link_used`` or ``link_revoked``, and ``link_stale`` once its ticket is no longer
        open (the run moved on)."""
        found = review.review_link_open(token=token)
        return Response({"agent": found.agent, "reason": found.reason, "prompt": found.prompt,
                         "schema": found.schema, "expires_at": when(found.expires_at),
                         "action": action_data(found.action)})

    @extend_schema(operation_id="review_answer", auth=[], request=ReviewAnswerSerializer,
                   responses={200: ReviewAnsweredSerializer, **REVIEW_ERRORS})
    def post(self, request, token):
        """Answer: resume the run with the input (or the decision) in the reviewer's name,
        and use up the link. Refused as GET is; 400 ``invalid`` for an input that the
        ticket's schema refuses."""
        review.review_link_known(token=token)  # a wrong token learns nothing more
        data = validated(ReviewAnswerSerializer, request)  # a bad body changes nothing
        review.review_link_use(token=token, name=data["name"],
                               input=ReviewAnswerSerializer.resume_input(data))
        return Response({"resumed": True})
