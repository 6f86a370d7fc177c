"""Which path decodes: the static-cache step of the model's architecture family, or
fairseq's own incremental decoding (the reference the steps are tested against).

``unsupported_reason(decoder)`` names what a decoder has that the static-cache steps
(``transformer_step.TransformerStep``, ``lstm_step.LSTMStep``) do not cover;
``use_step(decoder, who)`` says so once in the log, and callers then take fairseq's path;
``decoder_step`` builds the step a model needs.
"""
import logging
from typing import Callable, Optional

from torch import Tensor

from fairseq_ext.decoding.lstm_step import LSTMStep, lstm_unsupported_reason
from fairseq_ext.decoding.step_base import _DecoderStep
from fairseq_ext.decoding.transformer_step import TransformerStep, transformer_unsupported_reason

logger = logging.getLogger(__name__)
_FALLBACK_LOGGED = set()


def _is_lstm(decoder) -> bool:
    from fairseq.models.lstm import LSTMDecoder
    return isinstance(decoder, LSTMDecoder)


def unsupported_reason(decoder) -> Optional[str]:
    """Why no static-cache step (``TransformerStep``, ``LSTMStep``) can run ``decoder``, or
    None when one can."""
    return lstm_unsupported_reason(decoder) if _is_lstm(decoder) else transformer_unsupported_reason(decoder)


def use_step(decoder, who: str) -> bool:
    """Whether a static-cache step can run ``decoder``; when none can, one log line (per
    caller and decoder type) says that ``who`` takes fairseq's incremental path and why."""
    reason = unsupported_reason(decoder)
    if reason is not None and (who, type(decoder)) not in _FALLBACK_LOGGED:
        _FALLBACK_LOGGED.add((who, type(decoder)))
        logger.info(f"{who}: fairseq's incremental path for {type(decoder).__name__} (the static-cache steps "
                    f"cover fairseq's TransformerDecoder and LSTMDecoder: {reason})")
    return reason is None


def decoder_step(model, encoder_out, expand: Tensor, max_steps: int,
                 weights: Optional[Callable[[Tensor], Tensor]] = None, groups: int = 1,
                 differentiable: bool = False, capturable: bool = False, compiled: bool = False) -> "_DecoderStep":
    """The static-cache step of ``model``'s decoder (``unsupported_reason`` None):
    ``TransformerStep``, or ``lstm_step.LSTMStep`` for fairseq's LSTMDecoder; the
    arguments are ``TransformerStep``'s. compiled: a differentiable step built for
    ``compiled_step.compiled_logits`` (its weights not collected)."""
    cls = LSTMStep if _is_lstm(model.decoder) else TransformerStep
    return cls(model, encoder_out, expand, max_steps, weights, groups, differentiable, capturable, compiled)
