"""The heartbeats' lane (provisioner/api/admission.py Lanes): at most `beats_at_once` beats run their
units of work at once, the rest wait on the event loop in arrival order, and an operator's request is
admitted while beats wait."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from provisioner.api.admission import admitted, beat_admitted, of_app
from provisioner.settings import Settings


class _App:
    """What admission reads of an app (it keys its lanes by the app, weakly)."""

    def __init__(self, settings: Settings) -> None:
        self.state = SimpleNamespace(engine=None, settings=settings)


def _request(app: Any, path: str) -> Any:
    return SimpleNamespace(app=app, url=SimpleNamespace(path=path))


def test_at_most_beats_at_once_run_and_an_operator_request_passes_the_waiting_beats() -> None:
    app = _App(Settings(beats_at_once=2))
    running: list[int] = []
    most = 0
    release = asyncio.Event()

    async def beat(i: int) -> None:
        nonlocal most
        async with beat_admitted(_request(app, f"/v1/nodes/n{i}/heartbeat")):
            running.append(i)
            most = max(most, len(running))
            await release.wait()
            running.remove(i)

    async def scenario() -> tuple[int, list[int], bool]:
        beats = [asyncio.create_task(beat(i)) for i in range(6)]
        await asyncio.sleep(0.05)
        first_in = sorted(running)
        # an operator's unit of work is not behind the four waiting beats
        async with admitted(_request(app, "/v1/nodes")):
            operator_in = True
        lanes = of_app(app)
        assert lanes.beats.slots == 2 and lanes.units.slots > 2
        release.set()
        await asyncio.gather(*beats)
        return most, first_in, operator_in

    most_at_once, first_in, operator_in = asyncio.run(scenario())
    assert most_at_once == 2 and first_in == [0, 1] and operator_in
