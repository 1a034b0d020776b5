"""What a model call cost, in US dollars: the one price rule.

Prices come from ``genai-prices`` (the maintained table pydantic-ai uses), matched on the
model name the provider reported; ``AWAKEN_MODEL_PRICES`` names models of one's own
(private or self-hosted ones, or a negotiated rate) and wins over the table. A model found
in neither has no price: its cost is unknown (None), never 0, and so is the run's from then
on (``runs.domain.attempts.attempt_step``).
"""

import json
from decimal import Decimal
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PER_MILLION = Decimal(1_000_000)


def parse_prices(text: str) -> dict[str, tuple[Decimal, Decimal]]:
    """``AWAKEN_MODEL_PRICES`` as ``{model: (input, output)}``, dollars per million tokens:
    a JSON object ``{"model": {"input": 0.5, "output": 1.5}}``. Anything else is refused."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except ValueError as error:
        raise ImproperlyConfigured(f"AWAKEN_MODEL_PRICES is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ImproperlyConfigured("AWAKEN_MODEL_PRICES must be a JSON object: model name to "
                                   '{"input": …, "output": …} (dollars per million tokens).')
    prices = {}
    for model, price in data.items():
        if not (isinstance(price, dict) and set(price) == {"input", "output"} and all(
                isinstance(value, Decimal) and value.is_finite() and value >= 0
                for value in price.values())):
            raise ImproperlyConfigured(
                f"AWAKEN_MODEL_PRICES[{model!r}] must be {{\"input\": number, \"output\": "
                "number}: dollars per million tokens, 0 or more.")
        prices[model] = (price["input"], price["output"])
    return prices


@lru_cache(maxsize=1)
def _own(text: str) -> dict[str, tuple[Decimal, Decimal]]:
    return parse_prices(text)


def call_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """The cost of one call of ``model``, or None when the model has no price."""
    own = _own(settings.AWAKEN_MODEL_PRICES).get(model)
    if own is not None:
        cost = (own[0] * prompt_tokens + own[1] * completion_tokens) / PER_MILLION
        return float(cost)
    if not model:
        return None
    # Imported here: its table takes a seventh of a second to load, which every process
    # would pay at start (web, manage.py commands) though only a model call needs it.
    from genai_prices import Usage, calc_price
    try:
        price = calc_price(Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens),
                           model_ref=model)
    except LookupError:
        return None
    return float(price.total_price)


def prepare() -> None:
    """Load the price table (a worker does it off its loop, before its first attempt):
    importing it and its first lookup take a sixth of a second."""
    from genai_prices import Usage, calc_price
    try:
        calc_price(Usage(input_tokens=0, output_tokens=0), model_ref="")
    except LookupError:
        pass


def replies_cost(replies: list[dict]) -> tuple[float, list[str]]:
    """The cost of a step's model calls (the ``replies`` its event records, each with its
    ``model`` and ``usage``), and the models among them that have no price."""
    total, unpriced = 0.0, []
    for reply in replies:
        usage = reply.get("usage") or {}
        cost = call_cost(reply.get("model") or "", int(usage.get("prompt") or 0),
                         int(usage.get("completion") or 0))
        if cost is None:
            unpriced.append(reply.get("model") or "")
        else:
            total += cost
    return total, list(dict.fromkeys(unpriced))
