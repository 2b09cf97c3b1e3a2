"""The status clients' own socket (``StatusTracker.serve``) over a real CURVE
ROUTER: it answers status requests, ignores everything else, and a request it
fails to answer costs that request only, never the endpoint."""

from __future__ import annotations

import asyncio
import logging

import zmq.asyncio

from dtlaunch.supervisor.status.tracker import StatusTracker
from dtlaunch.wire.keys import create_run_keys
from dtlaunch.wire.messages import Ping, StatusReply, StatusRequest, StopJob
from dtlaunch.wire.sockets import Dealer, Router
from tests.test_jobstate import bring_up, make_state


def test_the_status_socket_answers_requests_ignores_the_rest_and_survives_a_failing_answer(
    tmp_path, caplog
):
    keys = create_run_keys(tmp_path / "keys")
    state = make_state(workers=2)
    bring_up(state)
    tracker = StatusTracker(run_id="r1", policy="none", mode="allreduce")
    fail_next = [False]
    real_reply = tracker.reply

    def reply(request, **kwargs):
        if fail_next[0]:
            fail_next[0] = False
            raise RuntimeError("a bug while building the answer")
        return real_reply(request, **kwargs)

    tracker.reply = reply  # type: ignore[method-assign]

    async def scenario() -> list[object]:
        server_ctx, client_ctx = zmq.asyncio.Context(), zmq.asyncio.Context()
        try:
            async with Router(server_ctx, keys, name="status router") as router:
                serving = asyncio.create_task(
                    tracker.serve(router, state=state, dds=None, controller=None)
                )
                got: list[object] = []
                async with Dealer(client_ctx, router.endpoint, keys.peer(), b"status:1") as dealer:
                    await dealer.send(StopJob(reason="a status client must not stop a job"))
                    await dealer.send(Ping(seq=1))
                    fail_next[0] = True
                    await dealer.send(StatusRequest(request_id=1, run_id="r1"))
                    await dealer.send(StatusRequest(request_id=2, run_id="another run"))
                    await dealer.send(StatusRequest(request_id=3, run_id="r1"))
                    while (answer := await dealer.recv(timeout=5.0)) is not None:
                        got.append(answer)
                        if isinstance(answer, StatusReply) and answer.request_id == 3:
                            break
                assert not serving.done()
                serving.cancel()
                return got
        finally:
            client_ctx.destroy(linger=0)
            server_ctx.destroy(linger=0)

    with caplog.at_level(logging.ERROR):
        answers = asyncio.run(asyncio.wait_for(scenario(), 30))
    # Request 1 failed (logged), request 2 belongs to another run: only 3 is answered.
    assert [type(a) for a in answers] == [StatusReply]
    assert answers[0].request_id == 3
    assert {n.rank for n in answers[0].snapshot.nodes} == {0, 1}
    assert "error answering a status request" in caplog.text
