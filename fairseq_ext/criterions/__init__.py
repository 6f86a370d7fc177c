"""fairseq criterions of fairseq-ext (registered on import)."""
from fairseq_ext.criterions import mgs, mrt, pg, residual_nce, scheduled_sampling, self_normalized_ce, soft_beam  # noqa: F401
