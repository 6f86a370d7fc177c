"""Compatibility shims between fairseq (0.12.2 / fairseq-fixed 0.12.3.1) and recent torch.

torch >= 2.6 loads files with ``weights_only=True`` by default, which rejects
fairseq checkpoints: they pickle ``argparse.Namespace`` and omegaconf configs.
fairseq reads checkpoints with ``torch.load`` in two modules:
``fairseq.checkpoint_utils`` (``load_checkpoint_to_cpu``: ``fairseq-generate
--path``, ``fairseq-train`` resuming, ``--restore-file``, ``load_model_ensemble``;
``load_ema_from_checkpoint``) and ``fairseq.distributed.utils`` (in data-parallel
training the other ranks unpickle the state that rank 0 broadcasts,
``_broadcast_object_slow``). In those two modules, and only there, ``torch``
becomes a view of torch whose ``load`` passes ``weights_only=False`` unless the
caller chose, exactly as fairseq loaded before torch 2.6. Nothing else changes:
no environment variable is set, and a ``torch.load`` anywhere else keeps torch's
safe default. A checkpoint is code; load only checkpoints you trust.

Without the plugin, run fairseq with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.

Crash safety: ``patch_checkpoint_copies`` makes fairseq's copies of a checkpoint
to ``checkpoint_last.pt`` / ``checkpoint_best.pt`` atomic (see its docstring).

Criterion configuration: ``patch_criterion_configuration`` gives a plugin criterion the
whole fairseq-train configuration (its text costs detokenize with the data's tokenizer).

Criterion state: ``patch_criterion_state`` saves a criterion's running state (PG's
moving baseline) with every checkpoint and gives it back on resume (see its
docstring).

Exact resume (on by default, ``FAIRSEQ_EXT_EXACT_RESUME=0`` turns it off):
``patch_resume_batches`` makes a resumed fairseq-train run cut its batches as the
uninterrupted run did, so it trains the same model (see its docstring).

Mixed precision: ``patch_amp_loss_scaler`` makes ``--amp`` unscale the gradient once
(fairseq 0.12 unscales it twice) and use ``--amp-init-scale`` and ``--amp-scale-window`` as
documented (see its docstring).

Clean exit: ``stop_batch_threads_at_exit`` stops fairseq's background batch
threads before the interpreter shuts down (see its docstring).

Dictionaries: ``runtime.dictionaries.patch_dictionary_check`` saves the dictionaries'
fingerprints with every checkpoint and refuses a checkpoint trained with other
dictionaries, the same size included.

Input mistakes: ``patch_input_errors`` (a data directory or split that does not
exist) and ``patch_checkpoint_errors`` (a checkpoint that is missing, does not
load, or does not fit the model, e.g. trained with another dictionary) end the
command with one line naming the file and the cause, exit status 2
(``runtime.cli.ConfigError``), instead of a traceback (see their docstrings).
"""
import atexit
import functools
import inspect
import logging
import os
import pickle
import queue
import re
import shutil
import threading
import time
import types
from typing import Callable, Optional

import torch

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.runtime.dictionaries import STATE_KEY as _STATE_KEY
from fairseq_ext.runtime.renamed import upgrade_checkpoint_cfg

# torch < 1.13 has no weights_only argument and always unpickles.
_HAS_WEIGHTS_ONLY = "weights_only" in inspect.signature(torch.load).parameters


class _TrustingTorch(types.ModuleType):
    """``torch`` as one fairseq module sees it: every attribute is torch's, but
    ``load`` defaults to ``weights_only=False`` (the caller's choice wins)."""

    __fairseq_ext_trusting__ = True

    def __init__(self) -> None:
        super().__init__("torch", torch.__doc__)

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def load(*args, **kwargs):
        if _HAS_WEIGHTS_ONLY:
            kwargs.setdefault("weights_only", False)
        return torch.load(*args, **kwargs)


def patch_checkpoint_loading() -> None:
    """fairseq 0.12 reads checkpoints with ``torch.load``, which torch >= 2.6 makes refuse them.

    In fairseq's two modules that load checkpoints, ``torch.load`` passes
    ``weights_only=False`` unless the caller chose (the module's docstring; idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    for module in (checkpoint_utils, distributed_utils):
        if not getattr(module.torch, "__fairseq_ext_trusting__", False):
            module.torch = _TrustingTorch()


def _atomic_copy(original: Callable) -> Callable:
    """``PathManager.copy`` for local files that replaces ``dst`` atomically."""

    def copy(src_path: str, dst_path: str, overwrite: bool = False):
        if "://" in str(src_path) or "://" in str(dst_path):
            return original(src_path, dst_path, overwrite=overwrite)
        if not overwrite and os.path.exists(dst_path):
            return False
        tmp = f"{dst_path}.tmp"
        with open(src_path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, dst_path)
        return True

    copy.__fairseq_ext_atomic__ = True
    return copy


def patch_checkpoint_copies() -> None:
    """fairseq copies a checkpoint to its other names non-atomically: a kill leaves it truncated.

    fairseq writes each checkpoint once (to a temporary file, then renamed) and
    copies it to the other names (``checkpoint_last.pt``, ``checkpoint_best.pt``)
    with a plain ``shutil.copyfile``: a run killed during that copy leaves a
    truncated ``checkpoint_last.pt`` and cannot resume (``EOFError: Ran out of
    input``; ``tests/test_robustness.py`` caught it). Within ``checkpoint_utils``
    the copy now goes to ``DST.tmp`` and is renamed over ``DST``, so the previous
    checkpoint stays whole until the new one is complete (idempotent)."""
    from fairseq import checkpoint_utils

    manager = checkpoint_utils.PathManager
    if getattr(manager.copy, "__fairseq_ext_atomic__", False):
        return
    checkpoint_utils.PathManager = type("AtomicCopyPathManager", (manager,),
                                        {"copy": staticmethod(_atomic_copy(manager.copy))})


_SAVED_CRITERION: dict = {}  # checkpoint path -> its saved criterion options, from loading it until resuming


def _warn_changed_criterion(path: str, saved, current) -> None:
    """On a resume, one warning listing the criterion options whose value differs from the
    checkpoint's (e.g. a default that changed since it was saved)."""
    if saved is None or current is None or saved.get("_name") != current.get("_name"):
        return
    changed = [(key, saved[key], current[key]) for key in current
               if key != "_name" and key in saved and str(saved[key]) != str(current[key])]
    if changed:
        what = ", ".join(f"--{k.replace('_', '-')} {now} (the checkpoint: {was})" for k, was, now in changed)
        logging.getLogger(__name__).warning(f"resuming {path} with {what}; pass the checkpoint's values to "
                                            "continue the run as it was")


def patch_criterion_state() -> None:
    """fairseq checkpoints no state of a criterion without parameters, and gives none back.

    Carry a criterion's running state through checkpoints (idempotent).

    fairseq checkpoints a criterion's state only when the criterion has parameters
    (and wraps such a criterion in DDP), and ``Trainer.load_checkpoint`` does not
    give a task its state back. A criterion with running state defines
    ``checkpoint_state() -> dict`` and ``load_checkpoint_state(dict)``;
    ``Trainer.save_checkpoint`` then stores that dict in the checkpoint's
    ``extra_state["fairseq_ext"]["criterion"]``, and ``Trainer.load_checkpoint``
    restores it, unless it is asked to reset the meters (``--reset-meters``, the
    first launch of ``--finetune-from-model``); a resume also warns, in one line, about
    each criterion option whose value differs from the checkpoint's (a default that
    changed since it was saved). A resumed run continues the state,
    at an epoch boundary as well as within an epoch; a fine-tuning run starts it
    afresh. Works with fairseq 0.12.2 and fairseq-fixed (both have these two
    methods with these signatures)."""
    from fairseq.trainer import Trainer

    if getattr(Trainer.save_checkpoint, "__fairseq_ext_state__", False):
        return
    save, load = Trainer.save_checkpoint, Trainer.load_checkpoint

    @functools.wraps(save)
    def save_checkpoint(self, filename, extra_state):
        get_state = getattr(self.get_criterion(), "checkpoint_state", None)
        if get_state is not None:
            extra_state = {**extra_state, _STATE_KEY: {**(extra_state.get(_STATE_KEY) or {}), "criterion": get_state()}}
        return save(self, filename, extra_state)

    @functools.wraps(load)
    def load_checkpoint(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                        reset_meters=False):
        extra_state = load(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides,
                           reset_meters=reset_meters)
        if extra_state is not None and not reset_meters:  # a resume: the run's own options go on
            _warn_changed_criterion(filename, _SAVED_CRITERION.pop(str(filename), None), self.cfg.criterion)
        set_state = getattr(self.get_criterion(), "load_checkpoint_state", None)
        saved = (extra_state or {}).get(_STATE_KEY, {}).get("criterion")
        if set_state is not None and saved is not None and not reset_meters:
            set_state(saved)
        return extra_state

    save_checkpoint.__fairseq_ext_state__ = True
    Trainer.save_checkpoint, Trainer.load_checkpoint = save_checkpoint, load_checkpoint


def patch_criterion_configuration() -> None:
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


def patch_resume_batches() -> None:
    """fairseq cuts a resumed run's batches with another seed than the uninterrupted run's.

    A resumed run trains the same model as the uninterrupted one (idempotent; on unless
    ``FAIRSEQ_EXT_EXACT_RESUME=0`` is in the environment, which keeps fairseq's batches).

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

    On by default: a run interrupted and resumed (a preempted job, a job out of its time limit)
    should be the model its command trains, not another sample of it. It changes, compared
    with fairseq without the plugin, the batches of any run that starts from a checkpoint
    of a later epoch without resetting the data loader (a resumed run, ``--restore-file``
    without ``--reset-dataloader``; ``--finetune-from-model`` resets it and is unaffected);
    ``FAIRSEQ_EXT_EXACT_RESUME=0`` repeats such a run as plain fairseq cut it
    (``examples/dss/multi30k.sh`` pins it: its published runs resume a copied warm-up
    checkpoint of epoch 1 and were made without the patch). Datasets that rebuild their batches every epoch
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


def patch_amp_loss_scaler() -> None:
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


def patch_input_errors() -> None:
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


def _shape(text: str) -> str:
    return "[" + text.strip() + "]"


def state_dict_mismatch(path: str, error: BaseException, dictionaries=()) -> Optional[str]:
    """What a ``load_state_dict`` error (``error`` or an exception it caused) says about
    ``path``, in one line, or None if it is not one. A size mismatch in the
    dictionary dimension (the model's side equals the length of one of
    ``dictionaries``) is named as such."""
    while error is not None and not (isinstance(error, RuntimeError)
                                     and "Error(s) in loading state_dict" in str(error)):
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    text = str(error)
    sizes = re.findall(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) from "
                       r"checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)", text)
    lengths = {len(d) for d in dictionaries if d is not None}
    for name, saved, built in sizes:
        saved_rows, built_rows = saved.split(",")[0].strip(), built.split(",")[0].strip()
        if saved_rows != built_rows and built_rows.isdigit() and int(built_rows) in lengths:
            return (f"{path}: the checkpoint's dictionary has {saved_rows} entries, the data's {built_rows}: it was "
                    f"trained with another dictionary (size mismatch for {name}: {_shape(saved)} in the checkpoint, "
                    f"{_shape(built)} in the model)")
    if sizes:
        name, saved, built = sizes[0]
        return (f"{path}: does not fit the model: {name} is {_shape(saved)} in the checkpoint, {_shape(built)} in the "
                f"model (were --arch and the model options the ones it was trained with?)")
    keys = []
    for kind in ("Missing", "Unexpected"):
        m = re.search(kind + r' key\(s\) in state_dict: (.*?)\.\s*$', text, re.M)
        if m:
            names = re.findall(r'"([^"]+)"', m.group(1))
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            keys.append(f"{kind.lower()} {', '.join(names[:3])}{more}")
    detail = "; ".join(keys) or text.strip().splitlines()[0]
    return f"{path}: does not fit the model ({detail}; were --arch and the model options the ones it was trained with?)"


def _dictionaries(task) -> list:
    out = []
    for name in ("source_dictionary", "target_dictionary"):
        try:
            out.append(getattr(task, name, None))
        except (NotImplementedError, AttributeError):
            pass
    return out


_UNREADABLE = ("PytorchStreamReader", "zip archive", "central directory", "invalid load key", "unpickling")


def not_a_checkpoint(path: str, error: BaseException) -> Optional[str]:
    """Why loading ``path`` as a fairseq checkpoint raised ``error``, where the reason is the
    file: not a file torch can read (truncated, another format: ``UnpicklingError: ...``), or
    one that holds no fairseq checkpoint (a tensor, a dict without a ``model`` entry); None
    for a fairseq checkpoint, whose error is something else (fairseq's upgrade steps, the
    plugin's), to propagate as it is."""
    def cause(e: BaseException) -> str:
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    if isinstance(error, (pickle.UnpicklingError, EOFError)) or (
            isinstance(error, RuntimeError) and any(mark in str(error) for mark in _UNREADABLE)):
        return cause(error)
    try:
        held = torch.load(path, map_location="cpu", **({"weights_only": False} if _HAS_WEIGHTS_ONLY else {}))
    except Exception as e:  # the file itself does not load
        return cause(e)
    if isinstance(held, dict) and "model" in held and ("cfg" in held or "args" in held):
        return None
    what = f"a dict with {', '.join(map(repr, list(held)[:4]))}" if isinstance(held, dict) else f"a {type(held).__name__}"
    return f"not a fairseq checkpoint: it holds {what}, not fairseq's model and cfg entries"


def patch_checkpoint_errors() -> None:
    """fairseq reports a checkpoint that is missing, unreadable or unfit with a traceback.

    A checkpoint that does not load ends the command with one line naming the file
    and the cause (``ConfigError``), instead of a traceback (idempotent):

    * ``checkpoint_utils.load_checkpoint_to_cpu`` (every checkpoint fairseq reads):
      a missing file gives ``FILE: no such checkpoint file``, and a file that is not a
      checkpoint (truncated, another format, not a fairseq checkpoint:
      ``not_a_checkpoint``) ``FILE: cannot load it as a checkpoint (CAUSE)``; any other
      error while loading a checkpoint propagates with its own traceback;
    * ``fairseq-train``: a ``--restore-file`` other than the default that does not
      exist (fairseq would silently train from scratch) and a missing
      ``--finetune-from-model`` (fairseq's ValueError traceback) give ``--restore-file
      FILE: no such checkpoint file``;
    * ``fairseq-generate --path`` (``load_model_ensemble_and_task``): a missing file
      gives ``FILE: no such checkpoint file``;
    * parameters that do not fit the model built from the options and data
      (``Trainer.load_checkpoint``, whose "Cannot load model parameters ... ensure that
      the architectures match" hid the cause above its traceback, and
      ``load_model_ensemble_and_task``): the cause, e.g. ``FILE: the checkpoint's
      dictionary has 2000 entries, the data's 1008: it was trained with another
      dictionary (size mismatch for decoder.embed_tokens.weight: ...)``
      (``state_dict_mismatch``).

    A checkpoint saved before an option of a plugin component was renamed has its
    saved config upgraded to the new names (``runtime.renamed``); loading is
    otherwise unchanged."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    to_cpu = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(to_cpu, "__fairseq_ext_errors__", False):
        return
    load_checkpoint, ensemble_and_task = checkpoint_utils.load_checkpoint, checkpoint_utils.load_model_ensemble_and_task
    trainer_load = Trainer.load_checkpoint

    @functools.wraps(to_cpu)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            state = to_cpu(path, *args, **kwargs)
        except FileNotFoundError as e:
            raise ConfigError(f"{path}: no such checkpoint file") from e
        except (pickle.UnpicklingError, EOFError, RuntimeError, KeyError, TypeError, AttributeError) as e:
            reason = not_a_checkpoint(path, e)
            if reason is None:  # a checkpoint, and something else went wrong: its own traceback
                raise
            raise ConfigError(f"{path}: cannot load it as a checkpoint ({reason})") from e
        overrides = args[0] if args else kwargs.get("arg_overrides")
        upgrade_checkpoint_cfg(state.get("cfg") if isinstance(state, dict) else None, overrides)
        cfg = state.get("cfg") if isinstance(state, dict) else None
        if cfg is not None and cfg.get("criterion") is not None:
            _SAVED_CRITERION[str(path)] = dict(cfg["criterion"])
        return state

    @functools.wraps(load_checkpoint)
    def checked_load_checkpoint(cfg, trainer, **kwargs):
        suffix = trainer.checkpoint_suffix or ""
        if cfg.restore_file != "checkpoint_last.pt":
            path = cfg.restore_file.replace(".pt", suffix + ".pt") if suffix else cfg.restore_file
            if not checkpoint_utils.PathManager.isfile(path):
                raise ConfigError(f"--restore-file {path}: no such checkpoint file")
        elif cfg.finetune_from_model is not None and getattr(cfg, "continue_once", None) is None:
            last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
            if not checkpoint_utils.PathManager.exists(last) \
                    and not checkpoint_utils.PathManager.exists(cfg.finetune_from_model):
                raise ConfigError(f"--finetune-from-model {cfg.finetune_from_model}: no such checkpoint file")
        return load_checkpoint(cfg, trainer, **kwargs)

    @functools.wraps(trainer_load)
    def trainer_load_checkpoint(self, filename, *args, **kwargs):
        try:
            return trainer_load(self, filename, *args, **kwargs)
        except ConfigError:
            raise
        except Exception as e:
            message = state_dict_mismatch(filename, e, _dictionaries(self.task))
            if message is None:
                raise
            raise ConfigError(message) from e

    @functools.wraps(ensemble_and_task)
    def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, strict=True, suffix="", num_shards=1,
                                     state=None, *args, **kwargs):
        if state is None:
            for name in filenames:
                for shard in range(num_shards):
                    path = checkpoint_utils.get_maybe_sharded_checkpoint_filename(name, suffix, shard, num_shards)
                    if not checkpoint_utils.PathManager.exists(path):
                        raise ConfigError(f"{path}: no such checkpoint file")
        try:
            return ensemble_and_task(filenames, arg_overrides, task, strict, suffix, num_shards, state,
                                     *args, **kwargs)
        except ConfigError:
            raise
        except Exception as e:
            message = state_dict_mismatch(" or ".join(map(str, filenames)), e, _dictionaries(task))
            if message is None:
                raise
            raise ConfigError(message) from e

    load_checkpoint_to_cpu.__fairseq_ext_errors__ = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    checkpoint_utils.load_checkpoint = checked_load_checkpoint
    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task
    Trainer.load_checkpoint = trainer_load_checkpoint
