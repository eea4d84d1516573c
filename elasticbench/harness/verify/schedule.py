"""Who judges which batch when: the parent and its lane (verify/lanes.py) each work through
the batches as their truths come in, neither waiting for the other while there is work.

The parent takes a batch from the reference processes as soon as its truths are in and the
lane has room, sends the lane its share and queues its own; between cases it passes on the
lane's answers that have come in. So a long share on one side (a graph compiled, a long row)
does not leave the other side idle, as it did when the parent sent batch i only once it had
judged its own share of batch i - 1 and then waited for the lane's (docs/numerics.md 6.9).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.ahead import SolvedAhead
from elasticbench.harness.verify.lanes import Lane, Share
from elasticbench.harness.verify.matrix import VerifyCase

LANE_ROOM = 2  # batches the lane may hold before the parent takes no more for it
HERE_ROOM = 2  # batches taken ahead of the one the parent is judging, for the lane's sake


def judge_batches(ahead: SolvedAhead, second: Lane,
                  todo: Callable[[str, VerifyCase], list[KernelSpec]], shared: Share | None,
                  judge: Callable, emit: Callable, on_truth: Callable[[int], None] | None
                  ) -> None:
    """Every batch judged: the lane's share (lanes.Share) sent to it, the rest judged here,
    the lane's records passed on (emit) as they come in; all of them before returning."""
    here: deque[tuple[list, list, list]] = deque()  # (prepared, truths, kernels judged here)
    there: deque[tuple[list, list, list]] = deque()  # (prepared, truths, share) the lane holds
    position = 0  # of the next batch's first case in the run

    def take() -> None:
        nonlocal position
        prepared, truths, handed = ahead.take()
        if on_truth:
            on_truth(len(prepared))
        mine = [todo(p.mode, p.case) for p in prepared]
        theirs = [[] if shared is None else shared.of(position + i, specs)
                  for i, specs in enumerate(mine)]
        position += len(prepared)
        sent = handed is not None and second.send(handed, theirs)
        if sent:
            there.append((prepared, truths, theirs))
        here.append((prepared, truths, [[k for k in specs if not sent or k not in share]
                                         for specs, share in zip(mine, theirs, strict=True)]))

    def pump() -> None:
        """Without waiting: the lane's answers that are in, passed on; batches whose truths
        are in, taken while the lane has room for them."""
        while there and second.ready():
            _received(second, there.popleft(), judge, emit)
        while (shared is not None and second.alive and len(there) < LANE_ROOM
               and len(here) <= HERE_ROOM and ahead.ready()):
            take()

    try:
        while ahead.left() or here:
            pump()
            if not here:
                while len(there) > LANE_ROOM:  # the lane is behind: none more until it answers
                    _received(second, there.popleft(), judge, emit)
                take()
            prepared, truths, specs = here.popleft()
            for prep, truth, kernels in zip(prepared, truths, specs, strict=True):
                for spec in kernels:
                    judge(prep, truth, [spec])
                    pump()
            del prepared, truths
        while there:
            _received(second, there.popleft(), judge, emit)
    except BaseException:
        # an error or an interrupt: the lane's records that are in are kept, nothing more
        while there and second.ready():
            _received(second, there.popleft(), _not_here, emit)
        raise


def _not_here(*_: Any) -> None:
    """Judging nothing: on the way out, a dead lane's share is left undone."""


def _received(second: Lane, held: tuple[list, list, list[list[KernelSpec]]],
              judge: Callable, emit: Callable) -> None:
    """The lane's records of a batch it held, passed on; a lane that died on it leaves its
    share to be judged here."""
    prepared, truths, share = held
    records = second.receive()
    if records is None:
        for prep, truth, specs in zip(prepared, truths, share, strict=True):
            judge(prep, truth, specs)
        return
    pairs: list[tuple[KernelSpec, Any]] = [
        (spec, prep.case) for prep, specs in zip(prepared, share, strict=True) for spec in specs]
    for (spec, case), record in zip(pairs, records, strict=True):
        emit(spec, case, record)
