"""Batching fix shared by the project's tasks."""


class KeepLastBatch:
    """Mixin for a FairseqTask: fairseq's batch iterator with
    ``required_batch_size_multiple`` = 1. fairseq main (fairseq-fixed) drops the last
    batch when its size is not a multiple of that (default 8), which silently skips
    test sentences in fairseq-generate."""

    def get_batch_iterator(self, dataset, **kwargs):
        kwargs["required_batch_size_multiple"] = 1
        return super().get_batch_iterator(dataset, **kwargs)
