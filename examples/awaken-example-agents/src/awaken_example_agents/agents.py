"""Two agents that call the model provider awaken-site is configured with.

awaken-site finds this module through the ``awaken.agents`` entry point of this package
(``pyproject.toml``) once the package is installed, or through ``AWAKEN_AGENTS`` when the
module is importable. Importing it registers the agents.
"""

from runs.agents import Agent, register, tool


@register
class Summarize(Agent):
    """Summarizes ``text`` in at most ``words`` words (30); the summary streams to the run's
    page as the model writes it, and is committed with the step."""

    name = "example.summarize"
    example = {"text": "A cancel is written first, then the work stops in milliseconds.",
               "words": 10}

    async def run(self, ctx):
        text = str(ctx.input.get("text") or "")
        if not text.strip():
            raise ValueError("input.text is empty: there is nothing to summarize")
        if "summary" not in ctx.state:  # a later attempt skips what is committed
            async with ctx.step():
                words = int(ctx.input.get("words", 30))
                reply = await ctx.chat([
                    {"role": "system",
                     "content": f"Summarize the user's text in at most {words} words."},
                    {"role": "user", "content": text},
                ], model=ctx.input.get("model"), temperature=0.2)
                ctx.state["summary"] = reply.content
        return {"summary": ctx.state["summary"]}


@tool
def count_words(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


@tool
def longest_word(text: str) -> str:
    """The longest word of a text."""
    return max(text.split(), key=len, default="")


@register
class TextStats(Agent):
    """Answers ``question`` about ``text`` with two Python tools the model may call."""

    name = "example.text_stats"
    example = {"text": "The quick brown fox jumps over the lazy dog.",
               "question": "Which word is the longest?"}

    async def run(self, ctx):
        text = str(ctx.input.get("text") or "")
        answer = await ctx.converse([
            {"role": "system", "content": "Use the tools to answer questions about the text."},
            {"role": "user", "content": text},
        ], tools=[count_words, longest_word], model=ctx.input.get("model"))
        return {"answer": answer}
