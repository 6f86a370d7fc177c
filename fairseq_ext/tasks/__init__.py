"""fairseq tasks (registered on import)."""
from fairseq_ext.tasks import text_completion  # noqa: F401
from fairseq_ext.tasks import sequence_tagging  # noqa: F401
from fairseq_ext.tasks import translation_mh  # noqa: F401
from fairseq_ext.tasks import residual_lm  # noqa: F401
from fairseq_ext.tasks import translation_search  # noqa: F401
from fairseq_ext.tasks import translation_mbr  # noqa: F401
