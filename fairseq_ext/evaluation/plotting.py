"""matplotlib, imported only when a figure is asked for (extra ``plot``, also in ``test``)."""
import logging


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend; a clear error naming
    the extra to install when matplotlib is missing. Importing fairseq sets the root
    logger to DEBUG, which would print matplotlib's font search: its logger is kept
    at WARNING."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'fairseq-ext[plot]' (or pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
