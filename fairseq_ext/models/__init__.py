"""fairseq models of fairseq-ext (registered on import)."""
from fairseq_ext.models import tagging_lstm  # noqa: F401
from fairseq_ext.models import residual_energy  # noqa: F401
