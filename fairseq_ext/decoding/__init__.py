"""Training-time decoding shared by the criteria (through fairseq models)."""
