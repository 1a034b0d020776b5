"""The documentation stays true to the code: every module, file and function it names
exists, every relative link leads somewhere, and the README's configuration table names
every setting the environment can set, as one table."""

import importlib
import re
from pathlib import Path

import pytest

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend

ROOT = Path(__file__).resolve().parent.parent
# The pages that describe the code as it is today. docs/performance.md is a record of
# measurements, each taken on the code of its day, and may name what has gone since.
CURRENT = ["README.md", "docs/architecture.md", "docs/agents.md", "docs/api.md",
           "docs/operations.md"]
PATH = re.compile(r"^(?:runs|awaken_site|harness|static|templates|tests|examples|docs)/"
                  r"[\w./-]*[\w/]$")
DOTTED = re.compile(r"^(?:runs|awaken_site|harness)(?:\.[A-Za-z_]\w*)+$")
FILE = re.compile(r"^\w+\.py$")  # a module named by its file alone, as in a table of one folder


def names_in(text: str) -> list[str]:
    """What a page names in code spans (Markdown) or text elements (SVG)."""
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"<text[^>]*>([^<]+)</text>", text)
    found = []
    for span in spans:
        for word in re.split(r"[\s,()]+", span):
            word = word.rstrip(".:;").split("(")[0]
            if PATH.match(word) or DOTTED.match(word) or FILE.match(word):
                found.append(word)
    return found


def exists(name: str) -> bool:
    if FILE.match(name):
        return (ROOT / name).exists() or any(
            found for folder in ("runs", "awaken_site", "harness", "tests")
            for found in (ROOT / folder).rglob(name))
    if PATH.match(name):
        return (ROOT / name).exists()
    return resolves(name) or name in task_names()


def task_names() -> set[str]:
    """The names of the Celery tasks (``runs.sweep``...), which read like module paths."""
    import runs.tasks  # noqa: F401  registers them
    from awaken_site.celery import app

    return set(app.tasks)


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute path inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


@pytest.mark.parametrize("page", [*CURRENT, "docs/architecture.svg"])
def test_every_name_a_page_gives_exists(page):
    text = (ROOT / page).read_text()
    missing = [name for name in names_in(text) if not exists(name)]
    assert not missing, f"{page} names what does not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("page", [*CURRENT, "docs/performance.md"])
def test_every_relative_link_leads_to_a_file(page):
    text = (ROOT / page).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    broken = [t for t in targets if "://" not in t
              and not (ROOT / page).parent.joinpath(t).exists()]
    assert not broken, f"{page} links to missing files: {broken}"


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350


def configuration_rows() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.strip().splitlines() if line.startswith("|")], section


def test_configuration_is_one_table_of_every_setting():
    rows, section = configuration_rows()
    # One table: its lines follow one another, with nothing between them.
    first = section.index(rows[0])
    assert section[first:].strip().startswith("\n".join(rows))
    documented = {name for row in rows[2:] for name in re.findall(r"`([A-Z][A-Z_0-9]+)`",
                                                                  row)}
    settings = (ROOT / "awaken_site/settings.py").read_text()
    read = set(re.findall(r'(?:getenv|envbool|envnumber|envlist)\(\s*"([A-Z_0-9]+)"', settings))
    # A renamed setting's old name, still read for a release.
    read |= set(re.findall(r'envrenamed\(\s*"[A-Z_0-9]+",\s*"([A-Z_0-9]+)"', settings))
    # The standard OpenTelemetry settings, read where traces are set up.
    read |= set(re.findall(r'"(OTEL_[A-Z_0-9]+)"', (ROOT / "runs/telemetry.py").read_text()))
    assert read - documented == set(), "settings read but not in the README's table"
    assert documented - read == set(), "in the README's table but read by no setting"
