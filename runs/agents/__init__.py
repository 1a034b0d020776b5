"""The catalogue of agents a run may name."""

CATALOGUE = {
    "demo.steps": "Steps through simulated inference calls, then completes with its output.",
    "demo.hang": "Its first inference never returns.",
    "demo.hang_tool": "Calls a blocking tool that never returns.",
    "demo.late": "Its inference ignores cancellation and answers late.",
    "demo.approval": "Asks for approval after a few steps, then continues or fails.",
    "demo.fail": "Raises after its steps.",
    "demo.parent": "Starts child runs in-process and waits for all of them.",
}
