"""Which subword segmentation a vocabulary or a text looks like (sentencepiece's word-initial
U+2581, subword-nmt's ``@@``), so that text costs and scorers remove it or warn."""
from typing import Iterable, Optional, Tuple


SUBWORD_MARKS = {
    "sentencepiece": "start with '\u2581'",  # word-initial pieces carry U+2581 (LOWER ONE EIGHTH BLOCK)
    "subword_nmt": "end with '@@'",  # word-internal pieces are followed by '@@'
}


def detect_subword_scheme(symbols: Iterable[str], min_share: float = 0.05) -> Tuple[Optional[str], float]:
    """Which subword segmentation ``symbols`` look like, with the share of them marked.

    symbols: a vocabulary's symbols (special symbols left out) or the whitespace
        tokens of a text.
    Returns ``("sentencepiece", share)`` when the share of symbols starting with
    U+2581 is the larger mark and at least ``min_share``, ``("subword_nmt",
    share)`` likewise for symbols ending in ``@@``, else ``(None, larger share)``.
    Neither mark occurs in ordinary words, so a real subword vocabulary is far
    above the 5% default (sentencepiece: most words start a piece; subword-nmt:
    every split word leaves an ``@@`` piece), and a word vocabulary is at 0.
    """
    n = sp = bpe = 0
    for s in symbols:
        n += 1
        sp += s.startswith("\u2581")
        bpe += s.endswith("@@")
    if n == 0:
        return None, 0.0
    scheme, share = ("sentencepiece", sp / n) if sp >= bpe else ("subword_nmt", bpe / n)
    return (scheme if share > 0 and share >= min_share else None), share
