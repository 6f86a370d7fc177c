"""Task ``translation_search``: fairseq's ``translation`` whose fairseq-generate
search can be the thesis's beam (Goyal, chapters 4-5) instead of fairseq's
``SequenceGenerator``: hard beam search ranking by summed log-probabilities
(``--search-normalization local``) or raw logits (``global``: a globally
normalised model, which ``SequenceGenerator``'s renormalisation would turn into a
different, locally normalised one), or soft beam decoding (section 4.3.4) at
``--search-alpha``. The output length is open: EOS ends a hypothesis within
fairseq's ``--max-len-a`` / ``--max-len-b`` limit (``BeamGenerator``,
``run_beam(stop_at_eos=True)``; fixed-size beam, no length normalisation).
``--search-normalization`` defaults to the normalisation a soft beam criterion
trained the checkpoint with (kept in its task state); asking for another warns.

Train with ``--task translation`` (or this task: training is translation's) and
decode any translation checkpoint:

    fairseq-generate DATA --user-dir "$(fairseq-ext-dir)" --task translation_search --path ckpt.pt \\
        --beam 3 --search-algorithm soft --search-alpha 100 --search-normalization global

docs/soft_beam.md documents the options.
"""
from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from fairseq_ext.generators.beam_generator import BeamSearchConfig, build_beam_generator
from fairseq_ext.runtime.validation import check_options
from fairseq_ext.tasks.batching import TaskBatching


@dataclass
class TranslationSearchConfig(TranslationConfig, BeamSearchConfig):
    num_shards: int = II("dataset.num_shards")  # fairseq-generate --num-shards (tasks/batching.py)
    shard_id: int = II("dataset.shard_id")


@register_task("translation_search", dataclass=TranslationSearchConfig)
class TranslationSearchTask(TaskBatching, TranslationTask):
    """``translation`` with the hard / soft beam of ``decoding/beam_search.py`` as
    fairseq-generate's search (``--search-algorithm``)."""

    cfg: TranslationSearchConfig

    def __init__(self, cfg: TranslationSearchConfig, src_dict, tgt_dict):
        check_options(TranslationSearchConfig, cfg)
        super().__init__(cfg, src_dict, tgt_dict)

    def build_generator(self, models, args, **kwargs):
        ours = build_beam_generator(
            self, models, self.target_dictionary, args, self.cfg, max_len_a=float(getattr(args, "max_len_a", 0.0)),
            max_len_b=int(getattr(args, "max_len_b", 200)))
        return ours if ours is not None else super().build_generator(models, args, **kwargs)
