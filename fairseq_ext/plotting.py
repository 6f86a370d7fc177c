"""matplotlib, imported only when a figure is asked for (optional extra ``plot``)."""


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend; a clear error naming
    the extra to install when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'fairseq-ext[plot]' (or pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
