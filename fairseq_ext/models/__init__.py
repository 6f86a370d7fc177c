"""fairseq models of fairseq-ext."""
