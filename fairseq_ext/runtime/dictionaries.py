"""A checkpoint knows its dictionaries: a fingerprint of the source and target
dictionaries is saved with every checkpoint, and a checkpoint is refused where the
data's dictionaries differ, the same size included.

fairseq catches a dictionary of another size (the embedding's shape does not fit,
``checkpoints.state_dict_mismatch``), but a dictionary of the same size built from another
BPE model loads silently and decodes into garbage. With the plugin loaded,
``Trainer.save_checkpoint`` stores ``extra_state["fairseq_ext"]["dictionaries"]``,
``{"source": FINGERPRINT, "target": FINGERPRINT}`` (a task with a dictionary per language,
``multilingual_translation``: ``{"dict.de": ..., "dict.en": ...}``), and loading such a checkpoint
(``fairseq-generate --path``, ``fairseq-train --restore-file`` /
``--finetune-from-model`` / a resume, ``load_model_ensemble``) with a task whose
dictionaries have other fingerprints raises ``DictionaryMismatch`` (one line and exit 2 in a
plugin command, ``runtime.cli``; the wrappers are in ``runtime.checkpoints``):

    fairseq-generate: error: ckpt.pt: trained with another target dictionary than data-bin/x's (2000 entries,
    fingerprint 0d3c5a1e9b7f in the checkpoint; 2000 entries, 8e01f2a4c6d5 in the data) ...

A checkpoint saved without the plugin has no fingerprint and loads as before.
``FAIRSEQ_EXT_DICT_CHECK=0`` loads a mismatched checkpoint anyway (for a dictionary
whose entries were renamed on purpose).

The fingerprint is the first 12 hex digits of the SHA-256 of the dictionary's symbols
in index order (special symbols included): the ids' meaning, not the counts.
"""
import hashlib
import os
from typing import Dict, Optional

from fairseq_ext.runtime.cli import ConfigError

STATE_KEY = "fairseq_ext"  # the plugin's entry in a checkpoint's extra_state
CHECK_ENV = "FAIRSEQ_EXT_DICT_CHECK"
SIDES = ("source", "target")


class DictionaryMismatch(ConfigError):
    """A checkpoint trained with other dictionaries than the data's."""


def fingerprint(dictionary) -> str:
    """12 hex digits of the SHA-256 of ``dictionary.symbols``, joined by newlines, in index order."""
    text = "\n".join(str(s) for s in dictionary.symbols)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def task_dictionaries(task) -> Dict[str, object]:
    """{side: Dictionary} of a task: "source" and "target", or, for a task with a dictionary per
    language (``dicts``: ``multilingual_translation``), "dict.LANG" for each language."""
    per_language = getattr(task, "dicts", None)
    if isinstance(per_language, dict) and per_language and \
            all(hasattr(d, "symbols") for d in per_language.values()):
        return {f"dict.{lang}": d for lang, d in sorted(per_language.items())}
    out = {}
    for side in SIDES:
        try:
            d = getattr(task, f"{side}_dictionary", None)
        except (NotImplementedError, AttributeError, KeyError):
            d = None
        if d is not None and hasattr(d, "symbols"):
            out[side] = d
    return out


def fingerprints(task) -> Dict[str, dict]:
    """{"source": {"fingerprint", "size"}, "target": ...} of a task's dictionaries (the sides it has)."""
    return {side: {"fingerprint": fingerprint(d), "size": len(d)} for side, d in task_dictionaries(task).items()}


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
    for side in saved:
        if side not in current:
            continue
        was, now = saved[side], current[side]
        if was["fingerprint"] != now["fingerprint"]:
            same = " (the same size, other entries)" if was["size"] == now["size"] else ""
            raise DictionaryMismatch(
                f"{path}: trained with another {side} dictionary than {_data_dir(task)}'s{same}: {was['size']} "
                f"entries, fingerprint {was['fingerprint']} in the checkpoint; {now['size']} entries, "
                f"{now['fingerprint']} in the data ({CHECK_ENV}=0 loads it anyway)")
