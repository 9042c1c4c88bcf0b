"""The server processes' event-loop runner: the cyclic GC as servers want it (styx_py.io.runtime)."""

from __future__ import annotations

import gc

from styx_py.io.runtime import SERVER_GC_GEN0, run, steady_gc


def test_server_gc_freezes_start_up_and_raises_the_young_threshold_while_main_runs() -> None:
    before = gc.get_threshold()
    seen: list[tuple[tuple[int, int, int], int]] = []

    async def main() -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))

    run(main(), server_gc=True)
    [(threshold, frozen)] = seen
    assert threshold == (SERVER_GC_GEN0, *before[1:]) and frozen > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0, "restored after"
    run(main())
    assert seen[1] == (before, 0), "without server_gc nothing changes"


def test_steady_gc_restores_the_threshold_when_its_body_fails() -> None:
    before = gc.get_threshold()
    try:
        with steady_gc(1234):
            assert gc.get_threshold()[0] == 1234
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
