"""Which step object decodes: the static-cache step of the model's architecture family, or
fairseq's own incremental decoding (the reference the steps are tested against).

Every decoding criterion (MGS, MRT, PG, DSS, the soft beam) has one option for it,
``--decoding-path`` (``DecodingPathConfig``): ``static-cache`` (the default) or
``fairseq``; ``static_cache(decoder, path, who)`` is the one place that decides.
``unsupported_reason(decoder)`` names what a decoder has that the static-cache steps
(``transformer_step.TransformerStep``, ``lstm_step.LSTMStep``) do not cover;
``use_step(decoder, who)`` says so once in the log, and callers then take fairseq's path;
``decoder_step`` builds the static-cache step a model needs. ``build_step`` is what the search
loops call: it returns the static-cache step or ``fairseq_step.FairseqStep`` (fairseq's
incremental decoding behind the same interface), so that no loop names the path.
"""
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import Tensor

from fairseq_ext.decoding.compiled_step import compiled_logits
from fairseq_ext.decoding.fairseq_step import FairseqStep
from fairseq_ext.decoding.lstm_step import LSTMStep, lstm_unsupported_reason
from fairseq_ext.decoding.step_base import DecoderStep
from fairseq_ext.decoding.transformer_step import TransformerStep, transformer_unsupported_reason

logger = logging.getLogger(__name__)
_FALLBACK_LOGGED = set()

PATHS = ("static-cache", "fairseq")
PATH_HELP = ("static-cache: decode with the static-cache step of the model's architecture family (fairseq's "
             "transformer and lstm decoders; any other decoder takes fairseq's path, said once in the log); "
             "fairseq: fairseq's own incremental decoding for every model (the reference the steps are tested "
             "against; the same results, slower)")


@dataclass
class DecodingPathConfig(FairseqDataclass):
    """The option every decoding criterion shares: which path decodes."""

    decoding_path: ChoiceEnum(PATHS) = field(default="static-cache", metadata={"help": PATH_HELP})


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
                 differentiable: bool = False, compiled: bool = False) -> "DecoderStep":
    """The static-cache step of ``model``'s decoder (``unsupported_reason`` None):
    ``TransformerStep``, or ``lstm_step.LSTMStep`` for fairseq's LSTMDecoder; the
    arguments are ``TransformerStep``'s. compiled: a differentiable step built for
    ``compiled_step.compiled_logits`` (its weights not collected)."""
    cls = LSTMStep if _is_lstm(model.decoder) else TransformerStep
    return cls(model, encoder_out, expand, max_steps, weights, groups, differentiable, compiled)


def static_cache(decoder, path: str, who: str) -> bool:
    """Whether ``who`` decodes ``decoder`` with the static-cache step: ``path`` is
    ``static-cache`` (``--decoding-path``) and a step covers the decoder (``use_step``)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return path == "static-cache" and use_step(decoder, who)


def build_step(model, encoder_out, expand: Tensor, max_steps: int, path: str, who: str,
               weights: Optional[Callable[[Tensor], Tensor]] = None, groups: int = 1,
               differentiable: bool = False, compiled: bool = False):
    """The step object that decodes ``expand.numel()`` rows of ``model`` (row r the input
    ``expand[r]`` of ``encoder_out``): the static-cache step where ``path`` and the decoder allow
    it (``static_cache``), else ``FairseqStep``. Both have ``logits(tokens, embeds, replace)``,
    ``step(tokens)``, ``reorder(index)`` and ``mix(weights, sentences)``. ``weights``, ``groups``:
    G parameter sets stepped together (static-cache only); ``compiled``: the static-cache step's
    ``logits`` compiled by ``torch.compile`` (``compiled_step``; fairseq's path is not compiled)."""
    if not static_cache(model.decoder, path, who):
        if groups > 1:
            raise ValueError(f"{who}: parameter sets are decoded together by the static-cache step only")
        return FairseqStep(model, encoder_out, expand)
    step = decoder_step(model, encoder_out, expand, max_steps, weights, groups, differentiable, compiled)
    if compiled:
        step.logits = compiled_logits(step)
    return step
