"""A rollout whose message list a task of the agent's changes while a call waits for its
answer: the capture tests of each client check that the call is recorded with what it sent."""

import asyncio

import artsdk as art

WAITING = "sleep 0.5 then answer"  # (the mock server holds its answer that long)


async def changed_while_waiting(server, create, messages, change):
    """Run a rollout that sends ``messages`` (``await create(messages)``), appends a user
    message the server holds its answer to, sends again, and while that call waits calls
    ``change(messages)``. Gives (the trajectory, the body the server received for the second
    call)."""
    before = len(server.requests)  # (the server serves the whole session)

    @art.rollout
    async def agent():
        await create(messages)  # the rollout's copies of this conversation exist: the next call reuses them
        messages.append({"role": "user", "content": WAITING})
        waiting = asyncio.create_task(create(messages))
        while len(server.requests) < before + 2:  # the request is out; the server holds the answer
            await asyncio.sleep(0.01)
        change(messages)
        await waiting

    t = await agent.collect()
    assert t.error is None and len(t.calls) == 2, t.error
    return t, server.requests[before + 1]["body"]
