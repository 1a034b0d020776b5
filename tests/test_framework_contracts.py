"""What the framework adapters (runs/agents/pydantic_ai.py, openai_agents.py, langgraph.py)
rely on in each framework: fails when an upgrade changes it, before a run does."""

import inspect

import pytest

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend


def parameters(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_pydantic_ai():
    from pydantic_ai import Agent, CancellationToken
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, UserPromptPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    assert {"message_history", "model", "cancellation_token", "capabilities"} <= parameters(
        Agent.iter)
    for hook in ("before_model_request", "wrap_model_request", "wrap_tool_execute"):
        assert hasattr(AbstractCapability, hook), hook
    assert {"call", "args", "handler"} <= parameters(AbstractCapability.wrap_tool_execute)
    assert "openai_client" in parameters(OpenAIProvider.__init__)
    assert callable(CancellationToken().cancel) and callable(OpenAIChatModel)
    assert ModelMessagesTypeAdapter.validate_python([]) == []
    assert ModelRequest(parts=[UserPromptPart("hi")]).parts[0].content == "hi"
    from pydantic_ai import RunContext

    assert hasattr(RunContext, "enqueue")  # the live inbox goes in through it
    # Approvals: a capability answers the deferred calls of requires_approval tools.
    from pydantic_ai import Tool
    from pydantic_ai.tools import DeferredToolResults, ToolApproved, ToolDenied

    assert hasattr(AbstractCapability, "handle_deferred_tool_calls")
    assert "requires_approval" in parameters(Tool.__init__)
    assert ToolApproved(override_args={"a": 1}).override_args == {"a": 1}
    assert ToolDenied("no").message == "no"
    assert DeferredToolResults(approvals={"c": True}).approvals == {"c": True}
    for check in ("is_model_request_node", "is_call_tools_node", "is_end_node"):
        assert hasattr(Agent, check), check


def test_openai_agents():
    from agents import MaxTurnsExceeded, RunConfig, RunHooks, Runner
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    assert {"max_turns", "run_config", "hooks"} <= parameters(Runner.run)
    assert {"model", "tracing_disabled"} <= parameters(RunConfig)
    assert "openai_client" in parameters(OpenAIChatCompletionsModel.__init__)
    assert MaxTurnsExceeded("x").run_data is None  # the SDK fills it in when it raises
    for hook in ("on_llm_start", "on_llm_end", "on_tool_start", "on_tool_end"):
        assert hasattr(RunHooks, hook), hook
    # Approvals: needs_approval interrupts the run; its RunState goes to JSON and back.
    from agents import RunState, ToolApprovalItem, function_tool

    assert "needs_approval" in parameters(function_tool)
    for method in ("to_json", "from_json", "get_interruptions", "approve", "reject"):
        assert hasattr(RunState, method), method
    assert "rejection_message" in parameters(RunState.reject)
    assert {"tool_name", "arguments"} <= set(dir(ToolApprovalItem))


def test_langgraph():
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        CheckpointTuple,
        writes_sort_key,
    )
    from langgraph.graph import START
    from langgraph.pregel import Pregel
    from langgraph.types import Command, Interrupt, StateSnapshot, interrupt

    from runs.agents.langgraph import START_NODE

    assert START == START_NODE
    assert {"stream_mode", "durability"} <= parameters(Pregel.astream)
    for method in ("aget_tuple", "alist", "aput", "aput_writes", "adelete_thread"):
        assert hasattr(BaseCheckpointSaver, method), method
    assert CheckpointTuple._fields[:5] == ("config", "checkpoint", "metadata", "parent_config",
                                           "pending_writes")
    assert writes_sort_key("p", "t", 1) == ("p", "t", 1)
    # interrupt() and its resume (runs.agents.langgraph.approval and the wrapper's _decide)
    assert set(WRITES_IDX_MAP) >= {"__interrupt__", "__resume__"}
    assert all(index < 0 for index in WRITES_IDX_MAP.values())
    assert "interrupts" in StateSnapshot._fields and {"id", "value"} <= set(dir(Interrupt))
    assert "resume" in parameters(Command) and "value" in parameters(interrupt)


@pytest.mark.parametrize("package, pinned", [("pydantic-ai-slim", "2.68.0"),
                                             ("openai-agents", "0.24.0"),
                                             ("langgraph", "1.2.24")])
def test_the_installed_versions_are_the_pinned_ones(package, pinned):
    from importlib.metadata import version

    assert version(package) == pinned
