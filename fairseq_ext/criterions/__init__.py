"""fairseq criterions of fairseq-ext (registered on import)."""
from fairseq_ext.criterions import mgs, mrt, pg  # noqa: F401
