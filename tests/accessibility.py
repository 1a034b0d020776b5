"""The axe-core accessibility scan for the browser tests (axe-core is vendored under
tests/vendor/axe-core with its licence)."""

from pathlib import Path

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")


def serious_violations(page) -> list[str]:
    """Scan the page as it stands; one line per serious or critical violation and node.

    The script goes in through the DevTools protocol, so the page's Content-Security-Policy
    stays on (an inline <script> tag would be refused by it)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    results = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [f"{violation['id']} ({violation['impact']}): {node['target']} {violation['help']}"
            for violation in results["violations"] if violation["impact"] in SERIOUS
            for node in violation["nodes"]]
