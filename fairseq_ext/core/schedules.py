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

from fairseq_ext.core.constraints import (
    OneOf,
    ParameterError,
    Range,
    above,
    at_least,
    between,
    check_arguments,
    declare,
)

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


# the parameter each schedule reads, and the values it takes
_EPS_RULES = {"inverse_sigmoid": ("k", at_least(1)), "exponential": ("k", between(0, 1, low_open=True, high_open=True)),
              "linear": ("slope", above(0))}


def _schedule_rule(owner, schedule: str, name: str, value: float, rule: Range) -> None:
    if not rule.holds(value):
        raise ParameterError(owner, name, f"must be {rule.text()} for the {schedule} schedule, got {value!r}")


@declare(schedule=OneOf(EPS_SCHEDULES), min_eps=between(0, 1))
def check_eps_schedule(schedule: str, k: float, slope: float, min_eps: float) -> None:
    """Raise ParameterError naming the bad parameter (k or slope: as ``schedule`` needs)."""
    check_arguments(check_eps_schedule, schedule=schedule, min_eps=min_eps)
    if schedule in _EPS_RULES:
        name, rule = _EPS_RULES[schedule]
        _schedule_rule(check_eps_schedule, schedule, name, {"k": k, "slope": slope}[name], rule)


@declare(value0=above(0), growth=above(0))
def exponential_growth(value0: float, growth: float, t: float, max_value: float = math.inf) -> float:
    """value0 * growth^max(t, 0), capped at ``max_value``; computed in log space
    (no overflow for any t). growth = 1 keeps the value fixed."""
    check_arguments(exponential_growth, value0=value0, growth=growth)
    log_value = math.log(value0) + max(t, 0.0) * math.log(growth)
    return min(max_value, math.exp(min(log_value, 700.0)))


ALPHA_SCHEDULES = ("fixed", "linear", "exponential")


@declare(schedule=OneOf(ALPHA_SCHEDULES))
def interpolated(schedule: str, value0: float, value1: float, t: float, horizon: float) -> float:
    """A value moving from ``value0`` to ``value1`` over ``horizon`` steps, then
    held: ``fixed`` value0; ``linear`` value0 + (value1 - value0) r; ``exponential``
    (geometric) value0 (value1 / value0)^r; r = min(max(t, 0) / horizon, 1) (the
    annealed alpha of thesis 4.3.3)."""
    check_arguments(interpolated, schedule=schedule)
    if schedule == "fixed":
        return value0
    for name, value in (("value0", value0), ("value1", value1), ("horizon", horizon)):
        _schedule_rule(interpolated, schedule, name, value, above(0))
    r = min(max(t, 0.0) / horizon, 1.0)
    if schedule == "linear":
        return value0 + (value1 - value0) * r
    return math.exp(math.log(value0) + r * (math.log(value1) - math.log(value0)))
