"""How text shown to people is shortened (runs/domain/text.py), and the places that cut
text doing it that way: a failed run's error, an activity line, an error quoting a value."""

import pytest

from runs import domain
from runs.domain import activity, text
from runs.domain.core import ERROR_CHARS, Ending
from runs.domain.errors import InvalidRequest
from runs.domain.limits import check_json
from runs.models import Activity
from tests.factories import queued_run, running_run

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value, limit, expected", [
    ("short", 10, "short"),
    ("exactly10!", 10, "exactly10!"),
    ("eleven char", 10, "eleven ch…"),
    ("", 3, ""),
])
def test_a_cut_text_fits_its_limit_and_ends_with_an_ellipsis(value, limit, expected):
    assert text.clipped(value, limit) == expected
    assert len(text.clipped(value, limit)) <= limit


def test_an_id_is_shown_by_its_first_group_and_an_error_by_its_first_line():
    assert text.short_id("0b6f1c2e-8d0a-4f5e-9c1b-2a3d4e5f6a7b") == "0b6f1c2e"
    assert text.first_line("  boom\n  at line 3\n") == "boom"
    assert text.first_line(None) == text.first_line("  ") == ""


def test_a_failed_runs_long_error_is_cut_to_its_column_with_an_ellipsis():
    run, generation = running_run()
    domain.attempt_finish(run_id=run.id, generation=generation,
                            ending=Ending.failed("Traceback\n" + "x" * 5000))
    run.refresh_from_db()
    assert len(run.error) == ERROR_CHARS and run.error.endswith(text.ELLIPSIS)
    assert run.error.startswith("Traceback\nxxx")


def test_a_long_activity_line_is_cut_the_same_way():
    run = queued_run()
    activity.activity_record(run_id=run.id, generation=1, entries=[
        {"kind": "log", "text": "x" * 900}])
    assert Activity.objects.get(run=run).text == text.clipped("x" * 900, activity.TEXT)


def test_an_error_quoting_a_long_key_quotes_it_cut():
    with pytest.raises(InvalidRequest) as refused:
        check_json({"k" * 100: "\x00"}, "input")
    assert ("k" * 39 + text.ELLIPSIS) in refused.value.message
