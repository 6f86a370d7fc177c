"""fairseq generators of fairseq-ext."""
