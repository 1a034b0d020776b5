"""Agents from a package outside the project: named by AWAKEN_AGENTS or found through the
``awaken.agents`` entry point of an installed package (``runs.apps.load_agents``)."""

import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest
from django.core.exceptions import ImproperlyConfigured

from harness.processes import ROOT
from runs import apps
from runs.domain import catalogue

# Agents load at start-up, before and without any database.
pytestmark = pytest.mark.ignores_database_url

PROBE = ("import json; from importlib.metadata import entry_points; "
         "from runs.domain.catalogue import CATALOGUE; print(json.dumps({"
         "'summarize': CATALOGUE['example.summarize'].__module__, "
         "'stats': CATALOGUE['example.text_stats'].__module__, "
         "'entry_points': [p.value for p in entry_points(group='awaken.agents')]}))")


def start_up(**env) -> subprocess.CompletedProcess:
    """A process of the project starting as any does (Django set up, agents loaded)."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("AWAKEN_AGENTS", "PYTHONPATH")}
    return subprocess.run([sys.executable, "manage.py", "shell", "-c", PROBE], cwd=ROOT,
                          env={**environment, **env}, capture_output=True, text=True,
                          timeout=120)


def test_the_setting_loads_a_modules_agents():
    done = start_up(PYTHONPATH=str(ROOT / "examples" / "awaken-example-agents" / "src"),
                    AWAKEN_AGENTS="awaken_example_agents.agents")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"summarize": "awaken_example_agents.agents",
                                       "stats": "awaken_example_agents.agents",
                                       "entry_points": []}


def test_an_installed_packages_entry_point_loads_its_agents(example_package):
    done = start_up(PYTHONPATH=str(example_package))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"summarize": "awaken_example_agents.agents",
                                       "stats": "awaken_example_agents.agents",
                                       "entry_points": ["awaken_example_agents.agents"]}


def test_a_module_that_cannot_be_imported_stops_the_start_up():
    done = start_up(AWAKEN_AGENTS="runs.agents.demo, no_such_package.agents")
    assert done.returncode != 0
    assert ("AWAKEN_AGENTS names 'no_such_package.agents', which cannot be imported"
            in done.stderr)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """An importable folder, and a catalogue that forgets what the test registers."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(catalogue, "CATALOGUE", dict(catalogue.CATALOGUE))
    return tmp_path


AGENT_MODULE = '''
from runs.agents import Agent{register_import}


{decorator}class Mine(Agent):
    name = "{name}"

    async def run(self, ctx):
        return {{}}
'''


def write_module(folder, module, name, registered=True):
    (folder / f"{module}.py").write_text(AGENT_MODULE.format(
        register_import=", register" if registered else "",
        decorator="@register\n" if registered else "", name=name))


def test_an_entry_point_may_name_one_agent_class(scratch, monkeypatch):
    write_module(scratch, "scratch_class", "scratch.mine", registered=False)
    point = EntryPoint(name="mine", value="scratch_class:Mine", group=apps.ENTRY_POINT_GROUP)
    monkeypatch.setattr(apps, "entry_points", lambda group: [point])
    apps.load_agents([])
    assert catalogue.CATALOGUE["scratch.mine"].__module__ == "scratch_class"


def test_two_agents_of_one_name_stop_the_start_up(scratch):
    write_module(scratch, "scratch_clash", "demo.chat")
    with pytest.raises(ImproperlyConfigured, match="Two agents are named 'demo.chat'"):
        apps.load_agents("scratch_clash")


def test_loading_the_same_module_twice_is_harmless(scratch):
    write_module(scratch, "scratch_again", "scratch.again")
    apps.load_agents(["scratch_again"])
    apps.load_agents("scratch_again,scratch_again")
    assert "scratch.again" in catalogue.names()


DEMO_PROBE = ("import json; from runs.domain.catalogue import CATALOGUE; "
              "print(json.dumps(sorted(n for n in CATALOGUE if n.startswith('demo.'))))")


def test_the_demo_agents_are_registered_only_when_asked_for():
    for flag, registered in (("0", False), ("1", True)):
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", DEMO_PROBE],
                              cwd=ROOT, env={**os.environ, "AWAKEN_DEMO_AGENTS": flag},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        names = json.loads(done.stdout.splitlines()[-1])
        assert ("demo.hang_tool" in names and "demo.parent" in names) is registered
        assert bool(names) is registered
