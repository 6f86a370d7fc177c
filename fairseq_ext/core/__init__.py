"""Pure-PyTorch math: no fairseq imports."""
