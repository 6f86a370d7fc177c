"""What the plugin changes in fairseq where its own components run.

``activate()`` applies them, once per process. It is called when fairseq's parser reads a
command line that chooses one of the plugin's components (``--task``, ``--criterion`` or
``--arch``: ``runtime.parser``), when a plugin criterion that needs the training
configuration is built (fairseq-hydra-train, Python), and by the plugin's own commands
(``python -m fairseq_ext.finetune``, ...). A command that chooses only fairseq's own
components runs as fairseq runs it, unless ``FAIRSEQ_EXT_FIXES=all`` asks for the fixes
there too (applied on import); ``FAIRSEQ_EXT_FIXES=none`` keeps them off everywhere.
docs/fairseq.md lists every change, with the fairseq test or script that shows the bug.

* ``configure_criterions``: a plugin criterion receives the whole fairseq-train
  configuration (``Trainer.__init__``); its text costs detokenize with the data's
  ``--tokenizer`` and ``--bpe``.
* ``exact_resume``: a resumed run cuts the batches the uninterrupted run cut
  (``FairseqTask.get_batch_iterator``; ``FAIRSEQ_EXT_EXACT_RESUME=0`` keeps fairseq's).
* ``amp_loss_scaler``: ``--amp`` unscales the gradient once and honours ``--amp-init-scale``
  and ``--amp-scale-window`` (``AMPOptimizer``; ``FAIRSEQ_EXT_AMP_FIX=0`` keeps fairseq's).
* ``checkpoints.atomic_copies``: copies to ``checkpoint_last.pt`` / ``checkpoint_best.pt``
  are atomic (``checkpoint_utils.PathManager``).
* ``stop_batch_threads_at_exit``: fairseq's batch threads finish before the interpreter
  exits (an ``atexit`` hook), so a run stopped mid-epoch does not abort with exit 134.
* ``input_errors``: a data directory or split that does not exist is named in one line
  (``tasks.setup_task``).
* on a command line, ``runtime.cli.install``: a ``ConfigError`` ends the command with one
  line, exit status 2 (``sys.excepthook``).
"""
import atexit
import functools
import inspect
import logging
import os
import queue
import threading
import time
from typing import Callable

import torch

from fairseq_ext.runtime import checkpoints, cli
from fairseq_ext.runtime.cli import ConfigError

FIXES_ENV = "FAIRSEQ_EXT_FIXES"  # "auto" (where the plugin's components run), "all" or "none"


def mode() -> str:
    """``FAIRSEQ_EXT_FIXES``: auto (the default), all or none; anything else is a ConfigError."""
    value = os.environ.get(FIXES_ENV, "auto") or "auto"
    if value not in ("auto", "all", "none"):
        raise ConfigError(f"{FIXES_ENV}={value}: expected auto, all or none")
    return value


def activate(command_line: bool = False) -> None:
    """Apply the fixes (idempotent; nothing with ``FAIRSEQ_EXT_FIXES=none``); on a command line,
    also the one-line ``ConfigError`` hook."""
    if command_line:
        cli.install()
    if mode() == "none":
        return
    configure_criterions()
    exact_resume()
    amp_loss_scaler()
    checkpoints.atomic_copies()
    stop_batch_threads_at_exit()
    input_errors()
def configure_criterions() -> None:
    """fairseq builds a criterion from its own section of the configuration alone.

    Give a plugin criterion the whole fairseq-train configuration (idempotent): text costs
    need the data's
    ``--tokenizer`` and ``--bpe``. ``Trainer.__init__`` calls the criterion's
    ``configure_from_training(cfg)`` where it has one, in every data-parallel worker,
    before the trainer is built."""
    from fairseq.trainer import Trainer

    init = Trainer.__init__
    if getattr(init, "__fairseq_ext_configure__", False):
        return

    @functools.wraps(init)
    def __init__(self, cfg, task, model, criterion, *args, **kwargs):
        configure = getattr(criterion, "configure_from_training", None)
        if configure is not None:
            configure(cfg)
        init(self, cfg, task, model, criterion, *args, **kwargs)

    __init__.__fairseq_ext_configure__ = True
    Trainer.__init__ = __init__


def _stop_background_consumers(timeout: float = 10.0) -> None:
    """Let every live ``fairseq.data.iterators.BackgroundConsumer`` finish: it stops
    after the batch it is making (its length limit set to 0), its queue is drained so
    that a blocked ``put`` returns, and it is joined (at most ``timeout`` seconds)."""
    from fairseq.data import iterators

    for thread in threading.enumerate():
        if not isinstance(thread, iterators.BackgroundConsumer) or not thread.is_alive():
            continue
        thread._max_len = 0
        deadline = time.monotonic() + timeout
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    thread._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(0.01)


EXACT_RESUME_ENV = "FAIRSEQ_EXT_EXACT_RESUME"


def exact_resume() -> None:
    """fairseq cuts a resumed run's batches with another seed than the uninterrupted run's.

    A resumed run trains the same model as the uninterrupted one (idempotent; applied by
    ``activate`` unless ``FAIRSEQ_EXT_EXACT_RESUME=0`` is in the environment, which keeps
    fairseq's batches).

    fairseq-fixed 0.12.3.1's ``FairseqTask.get_batch_iterator`` cuts the length-sorted
    batches once, from ``ordered_indices()`` under ``numpy_seed(seed + epoch)``, where
    ``epoch`` is the epoch at which the iterator is built, and reuses them in every later
    epoch (for datasets whose sizes do not change across epochs). An uninterrupted run
    builds it in epoch 1; a run resumed from a checkpoint of epoch e builds it in epoch
    e, so sentences of equal length are grouped into other batches and the model drifts
    away from the uninterrupted run's (``scripts/inspect/resume_exactness.sh``: the first batch
    after the resume meets the same parameters but holds other sentences). Here the
    batches of a reusable iterator are always cut with epoch 1's seed; the iterator still
    starts at the requested epoch, so the per-epoch shuffling of the batch order
    (``seed + epoch``) and a mid-epoch resume's position are fairseq's.

    On where the plugin's components run: a run interrupted and resumed (a preempted job, a
    job out of its time limit) should be the model its command trains, not another sample of
    it. It changes, compared with fairseq without the plugin, the batches of such a run that starts from a checkpoint
    of a later epoch without resetting the data loader (a resumed run, ``--restore-file``
    without ``--reset-dataloader``; ``--finetune-from-model`` resets it and is unaffected);
    ``FAIRSEQ_EXT_EXACT_RESUME=0`` repeats such a run as plain fairseq cut it
    (``examples/dss/multi30k.sh`` pins it: its published runs resume a copied warm-up
    checkpoint of epoch 1 and were made without the patch). ``FAIRSEQ_EXT_FIXES=all`` applies
    it to fairseq's own components too. Datasets that rebuild their batches every epoch
    (``can_reuse_epoch_itr_across_epochs`` false, a task config with ``rebuild_batches``,
    ``disable_iterator_cache``) are already exact and left alone."""
    if os.environ.get(EXACT_RESUME_ENV, "1") == "0":
        return
    from fairseq.tasks import FairseqTask

    original = FairseqTask.get_batch_iterator
    if getattr(original, "__fairseq_ext_exact_resume__", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def get_batch_iterator(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        epoch = a.get("epoch", 1)
        reusable = (epoch > 1 and not a.get("disable_iterator_cache", False)
                    and not a.get("update_epoch_batch_itr", False)
                    and not getattr(getattr(self, "cfg", None), "rebuild_batches", False)
                    and getattr(self, "can_reuse_epoch_itr", lambda dataset: False)(a["dataset"])
                    and a["dataset"] not in getattr(self, "dataset_to_epoch_iter", {}))
        if not reusable:
            return original(*bound.args, **bound.kwargs)
        a["epoch"] = 1
        itr = original(*bound.args, **bound.kwargs)
        itr.epoch = epoch  # what EpochBatchIterator(epoch=epoch) would hold
        a["dataset"].set_epoch(epoch)
        return itr

    get_batch_iterator.__fairseq_ext_exact_resume__ = True
    FairseqTask.get_batch_iterator = get_batch_iterator


AMP_FIX_ENV = "FAIRSEQ_EXT_AMP_FIX"


def amp_loss_scaler() -> None:
    """fairseq 0.12's ``--amp`` unscales the gradient twice and ignores its scaler's options.

    ``--amp`` unscales the gradient once, and its loss scaler starts at
    ``--amp-init-scale`` and grows after ``--amp-scale-window`` updates, as fairseq
    documents (idempotent).

    Two bugs of fairseq 0.12.2 / fairseq-fixed 0.12.3.1's ``AMPOptimizer``:

    * the update uses the gradient divided by the loss scale: ``clip_grad_norm`` (called
      at every update) unscales the gradient through ``GradScaler.unscale_`` of the torch
      optimizer, and ``step`` hands ``GradScaler.step`` the fairseq optimizer wrapping
      it, another object to the scaler, which unscales it a second time. SGD's step is
      then lr / scale times the gradient; Adam's is nearly scale-free but its epsilon
      acts as epsilon x scale, and the dynamic scale grows during training. Here
      ``clip_grad_norm`` unscales the object that ``step`` hands on, so it is unscaled once;
      the gradient norm fairseq logs and clips was already the once-unscaled one.
    * the scaler is built with ``init_scale=--fp16-init-scale`` and, when
      ``--amp-scale-window`` is given, ``growth_interval=--amp-init-scale`` (reported upstream:
      https://github.com/facebookresearch/fairseq/issues/5342). It is rebuilt here from the two
      ``--amp-*`` options; with neither given the scaler is fairseq's (both initial scales default to 128, the window to torch's 2000).

    ``tests/test_gpu.py`` shows both on CUDA (docs/performance.md);
    ``tests/test_amp_scaler.py`` checks both on the CPU against fairseq's own class.
    ``FAIRSEQ_EXT_AMP_FIX=0`` keeps fairseq's behaviour (to repeat a run made without the
    plugin)."""
    if os.environ.get(AMP_FIX_ENV, "1") == "0":
        return
    try:
        from fairseq.optim.amp_optimizer import AMPOptimizer
    except ImportError:  # a fairseq without AMP support
        return
    original_init = AMPOptimizer.__init__
    if getattr(original_init, "__fairseq_ext_amp__", False):
        return
    original_clip = AMPOptimizer.clip_grad_norm

    @functools.wraps(original_init)
    def __init__(self, cfg, params, fp32_optimizer, **kwargs):
        original_init(self, cfg, params, fp32_optimizer, **kwargs)
        options = {"init_scale": cfg.common.amp_init_scale}
        window = getattr(cfg.common, "amp_scale_window", None)
        if window is not None:
            options["growth_interval"] = window
        self._grad_scaler = torch.cuda.amp.GradScaler(**options)
        logging.getLogger(__name__).info(
            f"fairseq_ext: --amp loss scale starts at {options['init_scale']} (--amp-init-scale) and grows after "
            f"{options.get('growth_interval', 2000)} updates without overflow (--amp-scale-window)")

    @functools.wraps(original_clip)
    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        self.scaler.unscale_(self.fp32_optimizer)  # the object step() hands GradScaler.step
        grad_norm = self.fp32_optimizer.clip_grad_norm(max_norm, aggregate_norm_fn)
        if not torch.isfinite(grad_norm).all():
            new_loss_scale = self.next_loss_scale
            if new_loss_scale <= self.min_loss_scale:
                raise FloatingPointError(f"AMP: minimum loss scale reached ({self.min_loss_scale}): the loss is "
                                         f"probably exploding; try restarting training or use fp32 ({new_loss_scale})")
            logging.getLogger(__name__).info(f"AMP: overflow detected, setting scale to {new_loss_scale}")
        return grad_norm

    __init__.__fairseq_ext_amp__ = True
    AMPOptimizer.__init__ = __init__
    AMPOptimizer.clip_grad_norm = clip_grad_norm


def stop_batch_threads_at_exit() -> None:
    """fairseq's batch thread can still run in torch at exit, and the process aborts (exit 134).

    fairseq makes training batches in a daemon thread (``BufferedIterator``,
    ``--data-buffer-size`` > 0), still running when a run stops in the middle of an
    epoch (``--max-update``). At interpreter exit that thread can be inside torch
    while torch's static objects are destroyed: the process then aborts with
    "terminate called without an active exception" (exit 134) after fairseq has
    logged "done training" and saved everything, so scripts see a failed run.
    Registered at exit, this lets those threads finish first. Idempotent."""
    if getattr(stop_batch_threads_at_exit, "done", False):
        return
    atexit.register(_stop_background_consumers)
    stop_batch_threads_at_exit.done = True


def _not_found(error: OSError) -> str:
    """``FILE: no such file or directory`` from an OSError that names its file, else its message."""
    if error.filename:
        return f"{error.filename}: {(error.strerror or 'no such file').lower()}"
    return str(error)


def _with_input_errors(load_dataset: Callable) -> Callable:
    @functools.wraps(load_dataset)
    def checked(split, *args, **kwargs):
        try:
            return load_dataset(split, *args, **kwargs)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ConfigError(f"split {split}: {_not_found(e)}") from e

    return checked


def input_errors() -> None:
    """fairseq reports a data directory or split that does not exist with a traceback.

    A data directory or split that does not exist ends the command with one line
    naming the path (``ConfigError``), not fairseq's ``FileNotFoundError`` traceback
    (idempotent).

    ``fairseq.tasks.setup_task`` (every command sets its task up with it): a
    ``FileNotFoundError`` / ``NotADirectoryError`` becomes ``DATA: no such data
    directory`` when a path of the task's ``data`` (``:``-separated) does not exist,
    else ``FILE: no such file or directory`` (a dictionary the task reads, e.g. a
    wrong ``--source-lang``). The task it returns raises the same one line from
    ``load_dataset`` for a missing split (``--valid-subset``, ``--gen-subset``, ...):
    ``split valid: Dataset not found: valid (DATA)``. Nothing else changes: a task
    that finds its files behaves as before."""
    from fairseq import tasks, utils

    setup_task = tasks.setup_task
    if getattr(setup_task, "__fairseq_ext_inputs__", False):
        return

    @functools.wraps(setup_task)
    def checked_setup_task(cfg, **kwargs):
        try:
            task = setup_task(cfg, **kwargs)
        except (FileNotFoundError, NotADirectoryError) as e:
            data = getattr(cfg, "data", None)
            missing = [p for p in utils.split_paths(data) if not os.path.exists(p)] \
                if isinstance(data, str) and data and "://" not in data else []
            if missing:
                raise ConfigError(f"{missing[0]}: no such data directory") from e
            raise ConfigError(_not_found(e)) from e
        task.load_dataset = _with_input_errors(task.load_dataset)
        return task

    checked_setup_task.__fairseq_ext_inputs__ = True
    tasks.setup_task = checked_setup_task
