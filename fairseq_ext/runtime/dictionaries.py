"""A checkpoint knows its dictionaries: a fingerprint of the source and target
dictionaries is saved with every checkpoint, and a checkpoint is refused where the
data's dictionaries differ, the same size included.

fairseq catches a dictionary of another size (the embedding's shape does not fit,
``checkpoints.state_dict_mismatch``), but a dictionary of the same size built from another
BPE model loads silently and decodes into garbage. With the plugin loaded,
``Trainer.save_checkpoint`` stores ``extra_state["fairseq_ext"]["dictionaries"]``,
``{"source": FINGERPRINT, "target": FINGERPRINT}``, and loading such a checkpoint
(``fairseq-generate --path``, ``fairseq-train --restore-file`` /
``--finetune-from-model`` / a resume, ``load_model_ensemble``) with a task whose
dictionaries have other fingerprints ends with one line (``ConfigError``, exit 2):

    fairseq-generate: error: ckpt.pt: trained with another target dictionary than data-bin/x's (2000 entries,
    fingerprint 0d3c5a1e9b7f in the checkpoint; 2000 entries, 8e01f2a4c6d5 in the data) ...

A checkpoint saved without the plugin has no fingerprint and loads as before.
``FAIRSEQ_EXT_DICT_CHECK=0`` loads a mismatched checkpoint anyway (for a dictionary
whose entries were renamed on purpose).

The fingerprint is the first 12 hex digits of the SHA-256 of the dictionary's symbols
in index order (special symbols included): the ids' meaning, not the counts.
"""
import functools
import hashlib
import os
from typing import Dict, Optional

from fairseq_ext.runtime.cli import ConfigError

STATE_KEY = "fairseq_ext"  # the plugin's entry in a checkpoint's extra_state
CHECK_ENV = "FAIRSEQ_EXT_DICT_CHECK"
SIDES = ("source", "target")


def fingerprint(dictionary) -> str:
    """12 hex digits of the SHA-256 of ``dictionary.symbols``, joined by newlines, in index order."""
    text = "\n".join(str(s) for s in dictionary.symbols)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _task_dictionaries(task) -> Dict[str, object]:
    out = {}
    for side in SIDES:
        try:
            d = getattr(task, f"{side}_dictionary", None)
        except (NotImplementedError, AttributeError):
            d = None
        if d is not None and hasattr(d, "symbols"):
            out[side] = d
    return out


def fingerprints(task) -> Dict[str, dict]:
    """{"source": {"fingerprint", "size"}, "target": ...} of a task's dictionaries (the sides it has)."""
    return {side: {"fingerprint": fingerprint(d), "size": len(d)} for side, d in _task_dictionaries(task).items()}


def saved_fingerprints(extra_state) -> Optional[Dict[str, dict]]:
    """The fingerprints a checkpoint's ``extra_state`` holds, or None (saved without the plugin)."""
    if not isinstance(extra_state, dict):
        return None
    return (extra_state.get(STATE_KEY) or {}).get("dictionaries")


def _data_dir(task) -> str:
    for holder in (getattr(task, "cfg", None), getattr(task, "args", None)):
        data = getattr(holder, "data", None)
        if isinstance(data, str) and data:
            return data
    return "the data"


def check(path: str, saved: Optional[Dict[str, dict]], task) -> None:
    """Raise ``ConfigError`` naming ``path``, both fingerprints and the data directory where the
    checkpoint's saved fingerprints differ from ``task``'s dictionaries; nothing without
    saved fingerprints, a task, or with ``FAIRSEQ_EXT_DICT_CHECK=0``."""
    if not saved or task is None or os.environ.get(CHECK_ENV, "1") == "0":
        return
    current = fingerprints(task)
    for side in SIDES:
        if side not in saved or side not in current:
            continue
        was, now = saved[side], current[side]
        if was["fingerprint"] != now["fingerprint"]:
            same = " (the same size, other entries)" if was["size"] == now["size"] else ""
            raise ConfigError(
                f"{path}: trained with another {side} dictionary than {_data_dir(task)}'s{same}: {was['size']} "
                f"entries, fingerprint {was['fingerprint']} in the checkpoint; {now['size']} entries, "
                f"{now['fingerprint']} in the data ({CHECK_ENV}=0 loads it anyway)")


def patch_dictionary_check() -> None:
    """fairseq loads a checkpoint trained with another dictionary of the same size without a word.

    Save the task's dictionary fingerprints with every checkpoint and check them on loading
    (idempotent; see the module's docstring). Apply after ``checkpoints.patch_checkpoint_errors``."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    if getattr(Trainer.save_checkpoint, "__fairseq_ext_dictionaries__", False):
        return
    save, load = Trainer.save_checkpoint, Trainer.load_checkpoint
    to_cpu, ensemble_and_task = checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.load_model_ensemble_and_task
    loaded: Dict[str, Optional[dict]] = {}  # path -> its saved fingerprints, while an ensemble loads

    @functools.wraps(save)
    def save_checkpoint(self, filename, extra_state):
        mine = {**(extra_state.get(STATE_KEY) or {}), "dictionaries": fingerprints(self.task)}
        return save(self, filename, {**extra_state, STATE_KEY: mine})

    @functools.wraps(load)
    def load_checkpoint(self, filename, *args, **kwargs):
        extra_state = load(self, filename, *args, **kwargs)
        check(filename, saved_fingerprints(extra_state), self.task)
        return extra_state

    @functools.wraps(to_cpu)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        state = to_cpu(path, *args, **kwargs)
        if isinstance(state, dict):
            loaded[str(path)] = saved_fingerprints(state.get("extra_state"))
        return state

    @functools.wraps(ensemble_and_task)
    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        loaded.clear()
        result = ensemble_and_task(filenames, *args, **kwargs)
        task = result[2]
        for path, saved in list(loaded.items()):
            check(path, saved, task)
        loaded.clear()
        return result

    save_checkpoint.__fairseq_ext_dictionaries__ = True
    Trainer.save_checkpoint, Trainer.load_checkpoint = save_checkpoint, load_checkpoint
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task
