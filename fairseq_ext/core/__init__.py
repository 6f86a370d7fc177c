"""Pure-PyTorch math: no fairseq imports. Importing the package registers the built-in task
losses (``text_costs``, ``token_costs``) with ``task_losses``."""
from fairseq_ext.core import text_costs, token_costs  # noqa: F401
