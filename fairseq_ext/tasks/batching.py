"""Batch-iterator fixes shared by the project's tasks (translation_mh, translation_search,
residual_lm, sequence_tagging, text_completion)."""
from fairseq_ext.runtime.cli import ConfigError


class TaskBatching:
    """Mixin for a FairseqTask, whose config may have ``num_shards`` / ``shard_id``
    (``II("dataset.num_shards")`` / ``II("dataset.shard_id")``; without them, no sharding):

    - ``required_batch_size_multiple`` = 1: fairseq main (fairseq-fixed) drops the
      last batch when its size is not a multiple of that (default 8), which silently
      skips test sentences in fairseq-generate;
    - ``--num-shards N --shard-id i`` shard fairseq-generate: fairseq-generate deals
      the batches out by ``--distributed-world-size`` / ``--distributed-rank`` and
      ignores those two options. Either way shard i gets batches i, i + N, ... of the
      same batch list, so the shards' outputs together are one run's (the samplers
      seed each batch from its example ids, docs/distributed.md).
    """

    def get_batch_iterator(self, dataset, num_shards=1, shard_id=0, **kwargs):
        kwargs["required_batch_size_multiple"] = 1
        wanted = int(getattr(self.cfg, "num_shards", 1) or 1)
        if num_shards == 1 and wanted > 1:
            num_shards, shard_id = wanted, int(self.cfg.shard_id)
            if not 0 <= shard_id < num_shards:
                raise ConfigError(f"--shard-id must be in [0, --num-shards), got {shard_id} with {num_shards} shards")
        return super().get_batch_iterator(dataset, num_shards=num_shards, shard_id=shard_id, **kwargs)
