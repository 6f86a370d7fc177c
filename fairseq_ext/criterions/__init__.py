"""fairseq criterions of fairseq-ext (registered on import)."""
from fairseq_ext.criterions import mgs  # noqa: F401
