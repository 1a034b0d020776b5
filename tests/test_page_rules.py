"""The pages' script keeps no copy of a server rule: what it needs is given to it as data
(``#page-rules``), and the texts and formats the server defines are not in the script."""

import json
import re
from pathlib import Path

import pytest

from runs.domain.text import SHORT_ID
from runs.models import TicketReason
from runs.pages.page_rules import RESUME_WHY
from tests.conftest import browser_for, make_user

pytestmark = pytest.mark.django_db

SCRIPTS = sorted((Path(__file__).parent.parent / "static" / "runs").glob("*.js"))


@pytest.mark.parametrize("path", ["/", "/bulk/", "/overview/"])
def test_each_page_gives_its_script_the_servers_rules(path):
    page = browser_for(make_user("olga", "operator")).get(path).content.decode()
    found = re.search(r'<script id="page-rules" type="application/json">(.*?)</script>', page)
    rules = json.loads(found.group(1))
    assert rules["short_id"] == SHORT_ID
    assert set(rules["resume_why"]) == set(TicketReason.values)


def test_the_script_holds_none_of_the_servers_texts_or_cuts():
    source = "\n".join(path.read_text() for path in SCRIPTS)
    for text in RESUME_WHY.values():
        assert text not in source
    assert not re.search(rf"slice\(0, {SHORT_ID}\)", source)  # short ids: rules.short_id
    assert "statusLabel" not in source and "end_cause :" not in source
