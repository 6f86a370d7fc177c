"""Everything the plugin does to fairseq's checkpoints: one wrapper per fairseq function.

Installed on import (``install``; idempotent):

* ``checkpoint_utils.torch`` and ``distributed.utils.torch``: torch >= 2.6 loads files with
  ``weights_only=True`` by default, which refuses fairseq checkpoints (they pickle
  ``argparse.Namespace`` and omegaconf configs). fairseq reads checkpoints with
  ``torch.load`` in these two modules (``load_checkpoint_to_cpu``; in data-parallel training
  the state rank 0 broadcasts), and in them alone ``torch`` becomes a view of torch whose
  ``load`` passes ``weights_only=False`` unless the caller chose, as fairseq loaded before
  torch 2.6. No environment variable is set, and a ``torch.load`` anywhere else keeps
  torch's safe default. A checkpoint is code: load only checkpoints you trust. (Without the
  plugin, run fairseq with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.)
* ``checkpoint_utils.load_checkpoint_to_cpu`` (every checkpoint fairseq reads): a missing
  file raises ``CheckpointNotFound`` (``FILE: no such checkpoint file``; a
  ``FileNotFoundError`` too), a file that is not a fairseq checkpoint ``CheckpointUnreadable``
  (``FILE: cannot load it as a checkpoint (CAUSE)``); any other error keeps its own type and
  traceback. The saved configuration of a plugin component whose options were renamed is
  read under the new names (``runtime.renamed``).
* ``checkpoint_utils.load_model_ensemble_and_task`` (``fairseq-generate --path``, hub models):
  a missing file raises ``CheckpointNotFound``; parameters that do not fit the model raise
  ``ModelMismatch`` naming the cause (``state_dict_mismatch``: "the checkpoint's dictionary
  has 2000 entries, the data's 1008"); each file's saved dictionary fingerprints are checked
  against the task's (``runtime.dictionaries``).
* ``Trainer.save_checkpoint``: the checkpoint's ``extra_state["fairseq_ext"]`` holds the
  task's dictionary fingerprints and, for a plugin criterion, its options and its running
  state (``checkpoint_state()``, e.g. PG's moving baseline).
* ``Trainer.load_checkpoint`` (a resume, ``--restore-file``, ``--finetune-from-model``): the
  dictionary check; the criterion's running state given back (``load_checkpoint_state``)
  unless the meters are reset (``--reset-meters``, the first launch of
  ``--finetune-from-model``); on a resume, one warning line for each plugin criterion option
  whose value differs from the checkpoint's (a default that changed since it was saved);
  parameters that do not fit raise ``ModelMismatch`` with the cause, where fairseq's
  "Cannot load model parameters ... ensure that the architectures match" hid it above a
  traceback.

Installed where the plugin's components run (``runtime.fixes.activate``): ``atomic_copies``.

The criterion's state travels in ``extra_state`` because fairseq has no mechanism that
gives it back on a resume: a criterion's ``state_dict`` is saved only when it has
parameters (and a criterion with parameters is wrapped in DistributedDataParallel, which
refuses one with nothing to train), and the task's state (``task_state``) is restored by
``load_model_ensemble_and_task``, not by ``Trainer.load_checkpoint``.

The errors are ``ConfigError`` subclasses: a plugin command ends with their one line, exit
status 2 (``runtime.cli``); elsewhere they are exceptions whose message names the file.
"""
import contextlib
import functools
import inspect
import logging
import os
import pickle
import re
import shutil
import types
from typing import Callable, Iterator, Optional

import torch

from fairseq_ext.runtime import dictionaries
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.runtime.renamed import upgrade_checkpoint_cfg

# torch < 1.13 has no weights_only argument and always unpickles.
_HAS_WEIGHTS_ONLY = "weights_only" in inspect.signature(torch.load).parameters
STATE_KEY = dictionaries.STATE_KEY  # the plugin's entry in a checkpoint's extra_state
_MARK = "__fairseq_ext__"  # set on every wrapper: installing twice changes nothing


class CheckpointNotFound(ConfigError, FileNotFoundError):
    """A checkpoint file that does not exist (a ``FileNotFoundError`` as fairseq's own)."""


class CheckpointUnreadable(ConfigError):
    """A file that holds no fairseq checkpoint: truncated, another format, not fairseq's."""


class ModelMismatch(ConfigError):
    """A checkpoint whose parameters do not fit the model built from the options and data."""


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


def _shape(text: str) -> str:
    return "[" + text.strip() + "]"


def state_dict_mismatch(path: str, error: BaseException, task_dictionaries=()) -> Optional[str]:
    """What a ``load_state_dict`` error (``error`` or an exception it caused) says about
    ``path``, in one line, or None if it is not one. A size mismatch in the
    dictionary dimension (the model's side equals the length of one of
    ``task_dictionaries``) is named as such."""
    while error is not None and not (isinstance(error, RuntimeError)
                                     and "Error(s) in loading state_dict" in str(error)):
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    text = str(error)
    sizes = re.findall(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) from "
                       r"checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)", text)
    lengths = {len(d) for d in task_dictionaries if d is not None}
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


@contextlib.contextmanager
def _mismatch_named(path: str, task) -> Iterator[None]:
    """Inside the block, an error of ``load_state_dict`` (or one it caused) is raised as
    ``ModelMismatch`` naming its cause in ``path`` (``state_dict_mismatch``, the sizes read
    against ``task``'s dictionaries); any other error propagates as it is."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as e:
        message = state_dict_mismatch(path, e, dictionaries.task_dictionaries(task).values())
        if message is None:
            raise
        raise ModelMismatch(message) from e


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


def _plugin_state(extra_state) -> dict:
    """The plugin's entry of a checkpoint's ``extra_state`` ({} when there is none)."""
    return (extra_state.get(STATE_KEY) or {}) if isinstance(extra_state, dict) else {}


def _is_plugin(obj) -> bool:
    from fairseq_ext.runtime.components import is_plugin

    return is_plugin(type(obj))


def _criterion_options(cfg) -> dict:
    """A criterion section of a configuration as {option: its value as text}."""
    return {str(k): str(v) for k, v in (cfg or {}).items()}


def _warn_changed_criterion(path: str, saved: Optional[dict], current: dict) -> None:
    """On a resume, one warning listing the criterion options whose value differs from the
    checkpoint's (e.g. a default that changed since it was saved)."""
    if not saved or saved.get("_name") != current.get("_name"):
        return
    changed = [(key, saved[key], current[key]) for key in current
               if key != "_name" and key in saved and saved[key] != current[key]]
    if changed:
        what = ", ".join(f"--{k.replace('_', '-')} {now} (the checkpoint: {was})" for k, was, now in changed)
        logging.getLogger(__name__).warning(f"resuming {path} with {what}; pass the checkpoint's values to "
                                            "continue the run as it was")


def _wrap_load_checkpoint_to_cpu(original: Callable) -> Callable:
    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            state = original(path, *args, **kwargs)
        except FileNotFoundError as e:
            raise CheckpointNotFound(f"{path}: no such checkpoint file") from e
        except (pickle.UnpicklingError, EOFError, RuntimeError, KeyError, TypeError, AttributeError) as e:
            reason = not_a_checkpoint(path, e)
            if reason is None:  # a checkpoint, and something else went wrong: its own traceback
                raise
            raise CheckpointUnreadable(f"{path}: cannot load it as a checkpoint ({reason})") from e
        overrides = args[0] if args else kwargs.get("arg_overrides")
        upgrade_checkpoint_cfg(state.get("cfg") if isinstance(state, dict) else None, overrides)
        return state

    return load_checkpoint_to_cpu


def _wrap_load_model_ensemble_and_task(original: Callable) -> Callable:
    from fairseq import checkpoint_utils

    @functools.wraps(original)
    def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, strict=True, suffix="", num_shards=1,
                                     state=None, *args, **kwargs):
        if state is not None or num_shards != 1:  # a state in hand, or shards: fairseq's loop as it is
            with _mismatch_named(" or ".join(map(str, filenames)), task):
                return original(filenames, arg_overrides, task, strict, suffix, num_shards, state, *args, **kwargs)
        # one file at a time, each with its own state, so that its saved fingerprints are checked
        # against the task (built from the first file, as fairseq does); a missing file is
        # CheckpointNotFound from load_checkpoint_to_cpu
        ensemble, cfg = [], None
        for name in filenames:
            path = checkpoint_utils.get_maybe_sharded_checkpoint_filename(name, suffix, 0, 1)
            held = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)
            saved = dictionaries.saved_fingerprints(held.get("extra_state"))
            with _mismatch_named(str(path), task):
                models, cfg, task = original([name], arg_overrides, task, strict, suffix, 1, held, *args, **kwargs)
            dictionaries.check(str(path), saved, task)
            ensemble.extend(models)
        return ensemble, cfg, task

    return load_model_ensemble_and_task


def _wrap_save_checkpoint(original: Callable) -> Callable:
    @functools.wraps(original)
    def save_checkpoint(self, filename, extra_state):
        mine = {**_plugin_state(extra_state), "dictionaries": dictionaries.fingerprints(self.task)}
        criterion = self.get_criterion()
        if _is_plugin(criterion):
            mine["criterion_options"] = _criterion_options(self.cfg.criterion)
            get_state = getattr(criterion, "checkpoint_state", None)
            if get_state is not None:
                mine["criterion"] = get_state()
        return original(self, filename, {**extra_state, STATE_KEY: mine})

    return save_checkpoint


def _wrap_trainer_load_checkpoint(original: Callable) -> Callable:
    @functools.wraps(original)
    def load_checkpoint(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                        reset_meters=False, **kwargs):
        with _mismatch_named(filename, self.task):
            extra_state = original(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides,
                                   reset_meters=reset_meters, **kwargs)
        dictionaries.check(filename, dictionaries.saved_fingerprints(extra_state), self.task)
        mine = _plugin_state(extra_state)
        criterion = self.get_criterion()
        if extra_state is not None and not reset_meters and _is_plugin(criterion):  # a resume: its options go on
            _warn_changed_criterion(filename, mine.get("criterion_options"), _criterion_options(self.cfg.criterion))
            set_state = getattr(criterion, "load_checkpoint_state", None)
            if set_state is not None and mine.get("criterion") is not None:
                set_state(mine["criterion"])
        return extra_state

    return load_checkpoint


def _replace(owner, name: str, wrap: Callable) -> None:
    """``owner.name = wrap(owner.name)``, once."""
    current = getattr(owner, name)
    if not getattr(current, _MARK, False):
        replacement = wrap(current)
        setattr(replacement, _MARK, True)
        setattr(owner, name, replacement)


def install() -> None:
    """The wrappers applied on import (the module's docstring; idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from fairseq.trainer import Trainer

    for module in (checkpoint_utils, distributed_utils):
        if not getattr(module.torch, "__fairseq_ext_trusting__", False):
            module.torch = _TrustingTorch()
    _replace(checkpoint_utils, "load_checkpoint_to_cpu", _wrap_load_checkpoint_to_cpu)
    _replace(checkpoint_utils, "load_model_ensemble_and_task", _wrap_load_model_ensemble_and_task)
    _replace(Trainer, "save_checkpoint", _wrap_save_checkpoint)
    _replace(Trainer, "load_checkpoint", _wrap_trainer_load_checkpoint)


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

    return copy


def atomic_copies() -> None:
    """fairseq copies a checkpoint to its other names non-atomically: a kill leaves it truncated.

    fairseq writes each checkpoint once (to a temporary file, then renamed) and
    copies it to the other names (``checkpoint_last.pt``, ``checkpoint_best.pt``)
    with a plain ``shutil.copyfile``: a run killed during that copy leaves a
    truncated ``checkpoint_last.pt`` and cannot resume (``EOFError: Ran out of
    input``; ``tests/test_robustness.py`` caught it). Within ``checkpoint_utils``
    the copy goes to ``DST.tmp`` and is renamed over ``DST``, so the previous
    checkpoint stays whole until the new one is complete (idempotent; applied where the
    plugin's components run, ``runtime.fixes``)."""
    from fairseq import checkpoint_utils

    manager = checkpoint_utils.PathManager
    if getattr(manager.copy, _MARK, False):
        return
    copy = _atomic_copy(manager.copy)
    setattr(copy, _MARK, True)
    checkpoint_utils.PathManager = type("AtomicCopyPathManager", (manager,), {"copy": staticmethod(copy)})
