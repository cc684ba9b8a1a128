"""Seconds against size: a piecewise-linear curve over a fixed grid of sizes, refined online.

Pure (no torch), so that figures can draw the cost model a trace carries as well as the engine
can plan with it (``talon.cost.probe`` measures the curves; this module only holds them).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

CURVE_SIZES: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
LEARNING_RATE = 0.15  # online refinement: share of a step's prediction error folded back
MAX_ERROR = 0.5  # an observation moves the curve by at most this fraction of the prediction


@dataclass
class Curve:
    """Seconds against size: values on ``CURVE_SIZES`` sizes, linear in between, linear beyond."""

    values: list[float]  # one per CURVE_SIZES size
    # the curve at sizes asked so far, for the values it was computed from (planners and replays
    # ask the same few sizes thousands of times; any change of ``values`` starts a new memo)
    _memo: tuple[tuple[float, ...], dict[float, float]] = field(default_factory=lambda: ((), {}), repr=False,
                                                                compare=False)

    @staticmethod
    def fit(samples: dict[int, float]) -> "Curve":
        """Interpolate measured (size -> seconds) samples onto the grid (at least one sample)."""
        sizes = sorted(samples)
        xs = [float(s) for s in sizes]
        ys = [samples[s] for s in sizes]
        return Curve([_interp(xs, ys, float(g)) for g in CURVE_SIZES])

    @staticmethod
    def fit_monotone(samples: dict[int, float]) -> "Curve":
        """Like ``fit``, after an isotonic (non-decreasing) least-squares fit of the samples: a
        noisy probe where 1 token looks dearer than 2 pools the two instead of lifting every
        larger size to the outlier, as a running maximum would."""
        sizes = sorted(samples)
        return Curve.fit(dict(zip(sizes, isotonic([samples[s] for s in sizes]))))

    def __call__(self, size: float) -> float:
        size = max(float(size), 1.0)
        key, memo = self._memo
        if key != tuple(self.values):
            key, memo = tuple(self.values), {}
            self._memo = (key, memo)
        if size not in memo:
            memo[size] = max(_interp(_GRID_X, _running_max(self.values), size), 0.0)
        return memo[size]

    def observe(self, size: int, seconds: float, rate: float = LEARNING_RATE) -> None:
        """Fold one timing into the two grid points around ``size`` (LMS on the linear basis)."""
        predicted = _interp([float(g) for g in CURVE_SIZES], self.values, float(max(size, 1)))  # raw, not monotone
        error = seconds - predicted
        limit = MAX_ERROR * max(predicted, 1e-6)
        error = max(-limit, min(limit, error))
        i = bisect.bisect_right(CURVE_SIZES, size) - 1
        if i < 0:
            self.values[0] += rate * error
            return
        if i >= len(CURVE_SIZES) - 1:
            self.values[-1] += rate * error
            return
        w_hi = (size - CURVE_SIZES[i]) / (CURVE_SIZES[i + 1] - CURVE_SIZES[i])
        self.values[i] += rate * (1.0 - w_hi) * error
        self.values[i + 1] += rate * w_hi * error


_GRID_X = [float(g) for g in CURVE_SIZES]


def is_seconds(value: object) -> bool:
    """A finite number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_times(values: object, name: str) -> None:
    """A curve read from a file or an upload: one finite, positive time per ``CURVE_SIZES`` size (an
    increasing grid), or a ValueError that says which value is wrong."""
    if not isinstance(values, list) or len(values) != len(CURVE_SIZES):
        raise ValueError(f"{name} must hold one time per grid size ({len(CURVE_SIZES)} values)")
    for size, value in zip(CURVE_SIZES, values):
        if not is_seconds(value) or value <= 0:  # type: ignore[operator]
            raise ValueError(f"{name} at size {size} must be a finite, positive number of seconds, got {value!r}")


def isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def _running_max(values: list[float]) -> list[float]:
    out, best = [], float("-inf")
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends (flat for one point)."""
    if len(xs) == 1:
        return ys[0]
    j = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[j], xs[j + 1], ys[j], ys[j + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
