"""Training schedules as pure functions of a counter (epochs or updates), so that a
run resumed from a checkpoint continues them exactly where they were: the counter
is the only state, and fairseq checkpoints it.

- ``teacher_forcing_prob``: eps(t), the probability of feeding the gold token in
  scheduled sampling (Bengio et al. 2015, section 2.4; Goyal thesis 3.3.3):
  warm-up with eps = 1, then inverse sigmoid k / (k + exp(t / k)), exponential
  k^t, linear 1 - slope t, or 0 ("always sample", thesis Table 3.2), floored at
  ``min_eps``.
- ``exponential_growth``: alpha(t) = alpha_0 * growth^t, capped (the annealed
  alpha of thesis 3.3.3 / Table 3.1).
"""
import math

EPS_SCHEDULES = ("inverse_sigmoid", "exponential", "linear", "always")


def teacher_forcing_prob(
    schedule: str, counter: float, warmup: float = 0.0, k: float = 10.0, slope: float = 0.0, min_eps: float = 0.0
) -> float:
    """eps at ``counter`` (epochs done, or updates done).

    ``counter < warmup``: 1 (teacher forcing). Otherwise, with t = counter - warmup:
    inverse_sigmoid k / (k + exp(t / k)) (k >= 1; larger k decays more gently),
    exponential k^t (0 < k < 1), linear 1 - slope * t, always 0; the result is
    floored at ``min_eps``.
    """
    check_eps_schedule(schedule, k, slope, min_eps)
    if counter < warmup:
        return 1.0
    t = counter - warmup
    if schedule == "inverse_sigmoid":
        x = t / k
        # k / (k + e^x) = 1 / (1 + e^(x - log k)), safe for any x
        eps = 1.0 / (1.0 + math.exp(min(x - math.log(k), 700.0)))
    elif schedule == "exponential":
        eps = math.exp(t * math.log(k)) if k > 0 else 0.0
    elif schedule == "linear":
        eps = 1.0 - slope * t
    else:
        eps = 0.0
    return max(min_eps, min(1.0, eps))


def check_eps_schedule(schedule: str, k: float, slope: float, min_eps: float) -> None:
    """Raise ValueError naming the bad parameter."""
    if schedule not in EPS_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {EPS_SCHEDULES}")
    if schedule == "inverse_sigmoid" and not k >= 1.0:
        raise ValueError(f"the inverse sigmoid schedule needs k >= 1, got k = {k}")
    if schedule == "exponential" and not 0.0 < k < 1.0:
        raise ValueError(f"the exponential schedule needs 0 < k < 1, got k = {k}")
    if schedule == "linear" and not slope > 0.0:
        raise ValueError(f"the linear schedule needs a slope > 0, got {slope}")
    if not 0.0 <= min_eps <= 1.0:
        raise ValueError(f"min_eps must be in [0, 1], got {min_eps}")


def exponential_growth(value0: float, growth: float, t: float, max_value: float = math.inf) -> float:
    """value0 * growth^max(t, 0), capped at ``max_value``; computed in log space
    (no overflow for any t). growth = 1 keeps the value fixed."""
    if not value0 > 0 or not growth > 0:
        raise ValueError(f"value0 and growth must be > 0, got {value0} and {growth}")
    log_value = math.log(value0) + max(t, 0.0) * math.log(growth)
    return min(max_value, math.exp(min(log_value, 700.0)))


ALPHA_SCHEDULES = ("fixed", "linear", "exponential")


def interpolated(schedule: str, value0: float, value1: float, t: float, horizon: float) -> float:
    """A value moving from ``value0`` to ``value1`` over ``horizon`` steps, then
    held: ``fixed`` value0; ``linear`` value0 + (value1 - value0) r; ``exponential``
    (geometric) value0 (value1 / value0)^r; r = min(max(t, 0) / horizon, 1) (the
    annealed alpha of thesis 4.3.3)."""
    if schedule not in ALPHA_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {ALPHA_SCHEDULES}")
    if schedule == "fixed":
        return value0
    if not value0 > 0 or not value1 > 0 or not horizon > 0:
        raise ValueError(f"the {schedule} schedule needs value0, value1 and horizon > 0, "
                         f"got {value0}, {value1}, {horizon}")
    r = min(max(t, 0.0) / horizon, 1.0)
    if schedule == "linear":
        return value0 + (value1 - value0) * r
    return math.exp(math.log(value0) + r * (math.log(value1) - math.log(value0)))
