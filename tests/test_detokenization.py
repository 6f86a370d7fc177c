"""Text costs see the text the metric expects: BPE removed and detokenized with the data's
own tools (fairseq's ``--bpe`` / ``--tokenizer``, or the task's ``--eval-bleu-detok``), the
exact strings checked through fairseq-train on a Moses-tokenized subword-nmt corpus and on
a sentencepiece corpus, against the raw text they were prepared from."""
import json
import os
import random

import pytest

from conftest import REPO, run_cli

TESTS = os.path.join(REPO, "tests")
SUBJECTS = ["The cat", "My friend's dog", "A man", "Anna", "The old teacher", "Our neighbours"]
VERBS = ["sees", "doesn't like", "paints", "is looking at", "wants"]
OBJECTS = ["the house", "a red car", "the children's toys", "\"Blue Moon\"", "two apples", "the sea"]
ENDS = [".", "!", "?", ", doesn't it?", " (again)."]
DE = {"The cat": "Die Katze", "My friend's dog": "Der Hund meines Freundes", "A man": "Ein Mann", "Anna": "Anna",
      "The old teacher": "Der alte Lehrer", "Our neighbours": "Unsere Nachbarn", "sees": "sieht",
      "doesn't like": "mag nicht", "paints": "malt", "is looking at": "schaut an", "wants": "will",
      "the house": "das Haus", "a red car": "ein rotes Auto", "the children's toys": "das Spielzeug der Kinder",
      "\"Blue Moon\"": "\"Blue Moon\"", "two apples": "zwei Äpfel", "the sea": "das Meer", ".": ".", "!": "!",
      "?": "?", ", doesn't it?": ", nicht wahr?", " (again).": " (wieder)."}
TINY = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings", "--seed", "1",
        "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "400", "--max-update", "1", "--disable-validation",
        "--no-save", "--num-workers", "0", "--criterion", "mrt", "--mrt-candidates", "2",
        "--mrt-task-loss", "user_costs:Recorder"]


def raw_corpus(out, n=240, seed=3):
    """Parallel raw (untokenized) text, German-English, with punctuation Moses splits off:
    OUT/{train,valid,test}.{de,en}; returns the English and German sentences."""
    rng = random.Random(seed)
    en, de = [], []
    for _ in range(n):
        s, v, o, e = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(ENDS)
        en.append(f"{s} {v} {o}{e}")
        de.append(f"{DE[s]} {DE[v]} {DE[o]}{DE[e]}")
    os.makedirs(out, exist_ok=True)
    for split, rows in (("train", slice(0, 200)), ("valid", slice(200, 220)), ("test", slice(220, 240))):
        for lang, lines in (("en", en), ("de", de)):
            with open(os.path.join(out, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines[rows]) + "\n")
    return en, de


def prepared_corpora(root):
    """The raw corpus under ROOT/raw, prepared into ROOT/subword_nmt (Moses-tokenized, subword-nmt)
    and ROOT/sentencepiece (raw text, sentencepiece), both binarized: ({bpe: directory}, the
    English and German raw lines)."""
    en, de = raw_corpus(str(root / "raw"))
    out = {}
    for bpe, vocab in (("subword_nmt", "60"), ("sentencepiece", "120")):
        prepared = root / bpe
        run_cli(["python", "scripts/prepare/prepare_translation.py", str(prepared), "--src", "de", "--tgt", "en",
                 "--train", str(root / "raw" / "train"), "--valid", str(root / "raw" / "valid"), "--bpe", bpe,
                 "--vocab-size", vocab, "--binarize", "--joined-dictionary", "--no-clean"])
        out[bpe] = prepared
    return out, en, de


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """{bpe: (prepared directory, English raw lines, German raw lines)}."""
    prepared, en, de = prepared_corpora(tmp_path_factory.mktemp("detok"))
    return {bpe: (directory, en, de) for bpe, directory in prepared.items()}


def recorded(prepared, tmp_path, *args):
    record = tmp_path / "record.jsonl"
    if record.exists():
        record.unlink()
    run_cli(["fairseq-train", str(prepared / "bin"), "--user-dir", "fairseq_ext", *TINY, "--save-dir",
             str(tmp_path / "save"), *args], env={"PYTHONPATH": os.pathsep.join([REPO, TESTS]),
                                                  "RECORD_COSTS": str(record)})
    rows = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert rows
    return [r[1] for r in rows], [r[2] for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--tokenizer", "--eval-bleu-detok"])
def test_moses_subword_nmt_costs_see_the_raw_text(how, corpora, tmp_path):
    """Moses-tokenized and subword-nmt segmented data: with fairseq's ``--tokenizer moses
    --bpe subword_nmt`` or with the task's ``--eval-bleu-detok moses``, every reference and
    source the cost receives is a line of the raw corpus, exactly."""
    prepared, en, de = corpora["subword_nmt"]
    args = (["--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", str(prepared / "code"),
             "--source-lang", "de", "--target-lang", "en"] if how == "--tokenizer"
            else ["--eval-bleu-detok", "moses", "--eval-bleu-detok-args", '{"source_lang": "de", "target_lang": "en"}'])
    refs, sources = recorded(prepared, tmp_path, *args)
    assert set(refs) <= set(en[:200]), sorted(set(refs) - set(en[:200]))[:5]
    assert set(sources) <= set(de[:200]), sorted(set(sources) - set(de[:200]))[:5]
    assert any("'" in r for r in refs) and any("?" in r for r in refs)


@pytest.mark.slow
def test_without_a_tokenizer_the_cost_sees_tokenized_text(corpora, tmp_path):
    """The control: without the data's tokenizer only the subwords are removed, and the
    cost sees Moses's tokenized text (``dog &apos;s``, ``house .``), not the raw text."""
    prepared, en, _ = corpora["subword_nmt"]
    refs, _ = recorded(prepared, tmp_path)
    tokenized = set((prepared / "tok" / "train.en").read_text(encoding="utf-8").splitlines())
    assert set(refs) <= tokenized and not set(refs) & set(en)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["auto", "--bpe"])
def test_sentencepiece_costs_see_the_raw_text(how, corpora, tmp_path):
    """sentencepiece on raw text: the pieces removed (read off the dictionary, or by fairseq's
    ``--bpe sentencepiece``), every reference and source is a raw line, exactly."""
    prepared, en, de = corpora["sentencepiece"]
    args = ["--bpe", "sentencepiece", "--sentencepiece-model", str(prepared / "spm.model")] if how == "--bpe" else []
    refs, sources = recorded(prepared, tmp_path, *args)
    assert set(refs) <= set(en[:200]), sorted(set(refs) - set(en[:200]))[:5]
    assert set(sources) <= set(de[:200]), sorted(set(sources) - set(de[:200]))[:5]
