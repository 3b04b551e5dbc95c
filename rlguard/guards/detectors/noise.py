"""The step-to-step noise of a detector's rolling window (:func:`~rlguard.guards.detectors.base.differences_noise` of
its successive differences), kept beside the window as its values arrive, with a lower bound of it that costs O(1) a
step: a detector whose judgement needs the noise only where a value is far enough from its reference reads the bound
first, and the noise only where the bound does not settle the judgement."""

from __future__ import annotations

import itertools
import math
import operator

from rlguard.guards.detectors.base import differences_noise
from rlguard.guards.robust import RollingWindow

#: at least twice the unit roundoff of a double (2^-53, 1.1e-16): the most one addition or product rounds, relative to
#: its result, with room for the rounding of the error bound itself
ROUNDING = 1e-15


class DifferencesNoise:
    """:func:`~rlguard.guards.detectors.base.differences_noise` of the successive differences of a
    :class:`~rlguard.guards.robust.RollingWindow`'s values, and a lower bound of it. Kept beside a detector's state,
    not in it: it follows the window it was last given (a restored window is taken up from its values).

    The bound comes from a running sum of the differences' squares, updated by :meth:`push` (the square of the
    difference arriving added, that of the one leaving subtracted) beside a bound on its accumulated rounding error
    (each floating-point operation rounds by at most the unit roundoff of its result, Higham 2002, *Accuracy and
    Stability of Numerical Algorithms*, sec. 2.2): the running sum less that error is at most the exact sum of the
    squares, so its root mean square over ``sqrt(2)``, less the rounding of ``differences_noise``'s own sum, is at most
    the noise that function computes (the larger of the differences' robust sigma and their root mean square, over
    ``sqrt(2)``). The noise itself is computed from the differences as they stand: the running sum never enters it.
    """

    __slots__ = ("_diffs", "_error", "_pushes", "_squares", "_window")

    def __init__(self) -> None:
        self._window: RollingWindow | None = None  # the window the running sum is of
        self._pushes = -1  # its pushes then
        self._squares = 0.0  # sum of the squares of its successive differences, up to
        self._error = 0.0  # this
        # the differences kept beside a window that was read: (window, its pushes, differences)
        self._diffs: tuple[RollingWindow, int, RollingWindow] | None = None

    def push(self, window: RollingWindow, value: float) -> None:
        """``window.push(value)``, keeping the running sum of squares of its differences where it follows it."""
        values = window.values
        if self._window is window and self._pushes == window.pushes and values and math.isfinite(value):
            new = value - values[-1]  # the difference arriving: what ``window.values[-1] - window.values[-2]`` reads
            added, squares = new * new, self._squares
            kept = squares + added
            if len(values) == values.maxlen:  # the oldest value leaves, and with it the oldest difference
                old = values[1] - values[0]
                removed = old * old
                total = kept - removed
                self._error += ROUNDING * (added + removed + abs(kept) + abs(total))
            else:
                total = kept
                self._error += ROUNDING * (added + abs(kept))
            self._squares = total
            window.push(value)
            self._pushes = window.pushes
        else:
            window.push(value)

    def lower(self, window: RollingWindow) -> float:
        """A lower bound of :meth:`noise` of ``window`` (of at least 2 values) as computed in floating point; NaN
        (none known) where its values are not all finite or the squares of their differences overflow. The running
        sum is taken up again from the values where it does not follow ``window`` or its error bound has grown past
        a millionth of it (a large difference left the window)."""
        if self._window is not window or self._pushes != window.pushes or not self._error <= 1e-6 * self._squares:
            diffs = [b - a for a, b in itertools.pairwise(window.values)]
            self._squares = sum(map(operator.mul, diffs, diffs))
            self._error = ROUNDING * (len(diffs) + 1) * self._squares
            self._window, self._pushes = window, window.pushes
        n = len(window) - 1
        squares = self._squares - self._error
        if not squares > 0.0:
            return 0.0 if squares <= 0.0 else math.nan
        # ``differences_noise`` sums the n squares with n roundings, each at most ROUNDING of the sum; then a division,
        # a root and a division, each at most ROUNDING of its result
        return math.sqrt(squares * (1.0 - ROUNDING * n) / n) / math.sqrt(2) * (1.0 - 4 * ROUNDING)

    def differences(self, window: RollingWindow) -> RollingWindow:
        """The successive differences of ``window``'s values, in order: a window of them updated by one difference
        where ``window`` took one value since the last call (a push, not a window built), built from the values
        otherwise (after more pushes, a restored window, or one that is not finite)."""
        held = self._diffs
        if held is not None and held[0] is window and window.finite:
            if held[1] == window.pushes:
                return held[2]
            latest = window.values[-1] - window.values[-2] if len(window) >= 2 else math.nan
            if held[1] + 1 == window.pushes and math.isfinite(latest):
                held[2].push(latest)
                self._diffs = (window, window.pushes, held[2])
                return held[2]
        diffs = [b - a for a, b in itertools.pairwise(window.values)]
        size = max((window.values.maxlen or len(window)) - 1, len(diffs), 1)
        out = RollingWindow(size, diffs)
        self._diffs = (window, window.pushes, out)
        return out

    def noise(self, window: RollingWindow) -> float:
        """:func:`~rlguard.guards.detectors.base.differences_noise` of ``window``'s successive differences."""
        return differences_noise(self.differences(window))
