"""fairseq criterions of fairseq-ext."""
