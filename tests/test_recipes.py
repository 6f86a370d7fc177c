"""The paper-scale recipes (examples/mgs/iwslt14_de_en.sh, examples/mh_sampler/wmt.sh,
examples/mgs/wikitext103.sh) run end to end on local data laid out as their
downloads would be: Multi30k renamed into the IWSLT'14 and WMT'14 layouts, WikiText-2
into the WikiText-103 one. Every stage runs (but mgs_edit, the mgs stage with
another task loss), with tiny models and a few updates (EXTRA_* options appended
to the recipes' own commands), so every option name the recipes pass is checked by
fairseq; a second call skips finished stages; --dry-run prints the paper's settings
and touches nothing."""
import json
import os
import re
import time

import pytest

from conftest import REPO, run_cli


IWSLT = "examples/mgs/iwslt14_de_en.sh"
WMT = "examples/mh_sampler/wmt.sh"
WIKITEXT = "examples/mgs/wikitext103.sh"
TINY_TRANSFORMER = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
                    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
                    "--decoder-attention-heads 2 --max-tokens 1000 --update-freq 1")
TWO_UPDATES = "--max-update 2 --num-workers 0"


def recipe(script, work, *args, env=None, timeout=600):
    """Run a recipe on the CPU (NGPU=0 unless env says otherwise) with this checkout's code."""
    full = {"NGPU": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO, "PYTHON": "python"}
    full.update(env or {})
    return run_cli(["bash", script, str(work), *args], env=full, timeout=timeout)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(r + "\n" for r in rows)


def seg_file(path, rows, head="<srcset>"):
    write(path, [head, '<doc docid="1">'] + [f'<seg id="{i + 1}"> {r} </seg>' for i, r in enumerate(rows)]
          + ["</doc>", "</srcset>"])


def count_hypotheses(path):
    return sum(1 for line in lines(path) if line.startswith("H-"))


def all_stages_but(script, *skip):
    """--stage options selecting every stage of SCRIPT (from --list) except SKIP."""
    names = run_cli(["bash", script, "/nonexistent", "--list"]).stdout.split()[::2]
    return [arg for name in names if name not in skip for arg in ("--stage", name)]


def stage_lines(out):
    return [line for line in out.splitlines() if line.startswith("==>") and " stage " in line]


# --------------------------------------------------------------------------- IWSLT'14

IWSLT_TEST = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
              "IWSLT14.TED.tst2012"]


@pytest.fixture(scope="module")
def iwslt(real_data, tmp_path_factory):
    """The de-en/ directory of de-en.tgz, from Multi30k: 2,300 training pairs behind the
    talk metadata lines, 5 test XML files of 50 segments; then the whole recipe."""
    raw, m30k = tmp_path_factory.mktemp("iwslt_raw"), os.path.join(real_data, "multi30k")
    for lang in ("de", "en"):
        meta = ["<url>http://www.ted.com/talks/x.html</url>", "<keywords>talks, science</keywords>",
                "<talkid>1</talkid>", f"<title>Talk title {lang}</title>",
                f"<description>Talk summary {lang}</description>"]
        write(str(raw / f"train.tags.de-en.{lang}"), meta + lines(os.path.join(m30k, f"train.{lang}"))[:2300])
        test = lines(os.path.join(m30k, f"test.{lang}"))
        for k, name in enumerate(IWSLT_TEST):
            seg_file(str(raw / f"{name}.de-en.{lang}.xml"), test[50 * k:50 * (k + 1)])
    work = tmp_path_factory.mktemp("iwslt") / "work"
    env = {"IWSLT_RAW": str(raw), "BPE_TOKENS": "500", "EXTRA_TRAIN": TWO_UPDATES,
           "EXTRA_TRANSFORMER": TINY_TRANSFORMER,
           "EXTRA_LSTM": "--encoder-embed-dim 32 --encoder-hidden-size 32 --decoder-embed-dim 32 "
                         "--decoder-hidden-size 32 --decoder-out-embed-dim 32 --max-tokens 1000",
           "MODELS": "mle", "SPLITS": "test"}
    args = all_stages_but(IWSLT, "mgs_edit")
    proc = recipe(IWSLT, work, *args, env=env)
    return work, proc.stdout, env, args


@pytest.mark.slow
def test_iwslt_prepare_follows_fairseq_recipe(iwslt):
    work, out, _, _ = iwslt
    stats = json.load(open(work / "prep" / "stats.json"))
    kept = stats["train"] + stats["valid"]
    assert 2200 <= kept <= 2302  # 2,300 pairs + the title and description lines, minus cleaning
    assert stats["valid"] == kept // 23  # every 23rd pair
    assert stats["test"] == 250  # dev2010 + dev2012 + tst2010-2012, concatenated
    assert f"train: {stats['train']} pairs" in out
    tok = lines(work / "prep" / "tok" / "train.en") + lines(work / "prep" / "tok" / "valid.en")
    assert not any(tag in line for line in tok for tag in ("<url>", "talkid", "keywords", "<title>"))
    assert "talk summary en" in tok  # tags stripped, text kept, lowercased
    assert all(line == line.lower() for line in tok)
    assert len(lines(work / "prep" / "test.de")) == len(lines(work / "prep" / "test.en")) == 250
    assert any("@@ " in line for line in lines(work / "prep" / "train.en"))  # joint subword-nmt BPE
    assert (work / "data-bin" / "dict.de.txt").exists() and (work / "data-bin" / "dict.en.txt").exists()


@pytest.mark.slow
def test_iwslt_every_training_stage_trains(iwslt):
    work, _, _, _ = iwslt
    for name in ("mle", "mgs_sbleu", "mrt", "pg", "lstm_ce", "dss", "soft_beam"):
        assert (work / name / "checkpoint_last.pt").exists(), name
        log = open(work / "logs" / f"{name}.log").read()
        assert "num_updates 2" in log and "| bleu " in log, name  # validated with BLEU, beam 5
    assert "mgs_weight_entropy" in open(work / "logs" / "mgs_sbleu.log").read()
    scores = json.load(open(work / "gen" / "mle.test.beam5.json"))
    assert scores["n_sentences"] == 250  # every test sentence, none dropped by batching


@pytest.mark.slow
def test_iwslt_fine_tunes_the_users_data_and_checkpoints(iwslt, tmp_path):
    """DATA=, MLE= and LSTM_CE= (a user's binarized data and trained models): the stages
    that would make them say so and make nothing, the fine-tuning stages start from the
    given checkpoints, and score decodes them."""
    work, _, env, _ = iwslt
    mine = tmp_path / "work"
    given = {"DATA": work / "data-bin", "MLE": work / "mle" / "checkpoint_last.pt",
             "LSTM_CE": work / "lstm_ce" / "checkpoint_last.pt"}
    env = dict(env, MODELS="mle mgs_sbleu soft_beam", **{k: str(v) for k, v in given.items()})
    stages = ["download", "prepare", "binarize", "mle", "mgs_sbleu", "lstm_ce", "soft_beam", "score"]
    out = recipe(IWSLT, mine, *[a for name in stages for a in ("--stage", name)], env=env).stdout
    assert out.count(f"# DATA={given['DATA']} given: nothing to make") == 3
    assert f"# MLE={given['MLE']} given: nothing to make" in out
    assert f"# LSTM_CE={given['LSTM_CE']} given: nothing to make" in out
    assert not any((mine / d).exists() for d in ("orig", "prep", "data-bin", "mle", "lstm_ce"))
    for name, start in (("mgs_sbleu", given["MLE"]), ("soft_beam", given["LSTM_CE"])):
        assert (mine / name / "checkpoint_last.pt").exists(), name
        assert f"'finetune_from_model': '{start}'" in open(mine / "logs" / f"{name}.log").read(), name
    scores = json.load(open(mine / "gen" / "mle.test.beam5.json"))
    assert scores["n_sentences"] == 250


@pytest.mark.slow
def test_iwslt_rerun_skips_finished_stages(iwslt):
    work, _, env, args = iwslt
    start = time.time()
    out = recipe(IWSLT, work, *args, env=env).stdout
    assert len(stage_lines(out)) == 11 and all(line.endswith("done, skipped") for line in stage_lines(out))
    assert time.time() - start < 20
    out = recipe(IWSLT, work, "--stage", "download", "--force", env=env).stdout
    assert len(stage_lines(out)) == 1 and stage_lines(out)[0].endswith("stage download")


def test_iwslt_dry_run_prints_the_paper_settings(tmp_path):
    work = tmp_path / "w"
    out = recipe(IWSLT, work, "--dry-run", env={"NGPU": "2"}).stdout
    assert not work.exists()
    assert "wget -nv -O " in out and "de-en.tgz" in out
    assert "--lowercase --min-len 1 --max-len 175 --ratio 1.5 --bpe-tokens 10000" in out
    assert "--arch transformer_iwslt_de_en" in out and "--clip-norm 1.0 --patience -1" in out
    assert "--criterion mgs --mgs-candidates 4 --mgs-alpha 100 --mgs-noise 1.0" in out
    # MGS: four 16k-token searches per update, each pooled over the GPUs; MRT / PG: 64k tokens per update
    assert "--max-tokens 8000 --update-freq 4 --criterion mgs" in out
    assert "--max-tokens 16000 --update-freq 2 --criterion mrt" in out
    train = [line for line in out.splitlines() if line.startswith("fairseq-train")]
    assert len(train) == 8 and all("--distributed-world-size 2" in line for line in train)
    assert all("--update-epoch-batch-itr True" in line for line in train)  # exact resume
    assert "--criterion mrt" in out and "--criterion pg" in out and "--criterion soft_beam_direct_loss" in out
    assert "--beam 5" in out and "--beam 1" in out
    # DSS as the Multi30k evidence recommends: soft-sample, alpha fixed, gentle decay
    assert ("--dss-mode soft-sample --dss-schedule inverse_sigmoid --dss-schedule-unit epoch --dss-warmup 1 "
            "--dss-decay-k 100 --dss-alpha 1 --max-epoch") in out


def test_stage_selection_and_errors(tmp_path):
    out = recipe(IWSLT, tmp_path / "w", "--dry-run", "--from", "mrt", "--to", "pg").stdout
    assert [line for line in out.splitlines() if line.startswith("# stage")] == ["# stage mrt", "# stage pg"]
    out = recipe(IWSLT, tmp_path / "w", "--dry-run", "--stage", "dss", "--stage", "mle").stdout
    assert [line for line in out.splitlines() if line.startswith("# stage")] == ["# stage mle", "# stage dss"]
    with pytest.raises(AssertionError, match="unknown stage 'nope'"):
        recipe(IWSLT, tmp_path / "w", "--stage", "nope")
    out = recipe(WMT, tmp_path / "w", "--list").stdout
    assert out.split() == [w for s in ("download prepare binarize subset20 cmlm baselines mh score").split()
                           for w in (s, "-")]


def test_clean_and_read_raw_follow_moses_and_fairseq(tmp_path):
    """scripts/prepare/prepare_translation.py's reading and cleaning, seen in the tokenized text it
    writes (no tokenizer: --tokenize none)."""
    pairs = [("a  b ", "x y"), ("a b c d", "x"), ("", "x"), ("a " * 6, "x " * 4), ("a " * 7, "x " * 7), ("a|b", "x")]
    filler = [("dog eats green apples", "hund isst grosse aepfel")] * 40  # text for subword-nmt to learn merges from
    write(str(tmp_path / "train.de"), [p[0] for p in pairs + filler])
    write(str(tmp_path / "train.en"), [p[1] for p in pairs + filler])
    write(str(tmp_path / "dev.de.xml"), ["<doc>", '<seg id="1">  It\u2019s here  </seg>', "<title>no seg</title>",
                                         '<seg id="2">b</seg>'])
    write(str(tmp_path / "dev.en.xml"), ['<seg id="1">x</seg>', '<seg id="2">y</seg>'])
    tags = ["<url>u</url>", "<talkid>3</talkid>", "<keywords>k</keywords>"]
    write(str(tmp_path / "tags.de"), tags + ["<title>T</title>", "text"] + [p[0] for p in filler])
    write(str(tmp_path / "tags.en"), tags + ["<title>A</title>", "words"] + [p[1] for p in filler])

    def prepare(out, train, *extra):
        run_cli(["python", "scripts/prepare/prepare_translation.py", str(out), "--src", "de", "--tgt", "en",
                 "--train", str(train), "--valid", str(tmp_path / "dev.{l}.xml"), "--tokenize", "none",
                 "--max-len", "6", "--ratio", "1.5", "--vocab-size", "8", *extra], timeout=120)
        return {f: (out / "tok" / f).read_text().splitlines() for f in ("train.de", "train.en", "valid.de")}

    # clean-corpus-n.perl: squeeze, drop empty sides, lengths outside [1, 6], ratio above 1.5
    tok = prepare(tmp_path / "out", tmp_path / "train")
    assert list(zip(tok["train.de"], tok["train.en"]))[:3] == [("a b", "x y"), ("a a a a a a", "x x x x"), ("ab", "x")]
    assert len(tok["train.de"]) == 3 + len(filler)
    # each dropped pair counted under its rule, printed and kept in stats.json
    assert json.load(open(tmp_path / "out" / "stats.json"))["train_dropped"] == {
        "empty": 1, "min_len": 0, "max_len": 1, "ratio": 1}
    assert tok["valid.de"] == ["It's here", "b"]  # the <seg> contents of .xml, apostrophe normalised
    assert prepare(tmp_path / "iwslt", tmp_path / "tags", "--iwslt-tags")["train.de"][:2] == ["T", "text"]


# --------------------------------------------------------------------------- WMT

@pytest.fixture(scope="module")
def wmt(real_data, tmp_path_factory):
    """The extracted WMT'14 archives, from Multi30k: three training corpora (1,600 pairs),
    newstest2013 (100 pairs, plain text), newstest2014 (60 pairs, SGML); then the recipe."""
    raw, m30k = tmp_path_factory.mktemp("wmt_raw"), os.path.join(real_data, "multi30k")
    for lang in ("de", "en"):
        train = lines(os.path.join(m30k, f"train.{lang}"))
        write(str(raw / "training" / f"europarl-v7.de-en.{lang}"), train[:800])
        write(str(raw / f"commoncrawl.de-en.{lang}"), train[800:1200])
        write(str(raw / "training" / f"news-commentary-v12.de-en.{lang}"), train[1200:1600])
        write(str(raw / "dev" / f"newstest2013.{lang}"), lines(os.path.join(m30k, f"val.{lang}"))[:100])
        kind = "src" if lang == "en" else "ref"
        seg_file(str(raw / "test-full" / f"newstest2014-deen-{kind}.{lang}.sgm"),
                 lines(os.path.join(m30k, f"test.{lang}"))[:60], head=f'<{kind}set setid="newstest2014">')
    work = tmp_path_factory.mktemp("wmt") / "work"
    # 30 updates at a high learning rate: an untrained length predictor asks for ~250-token
    # translations, and an MH epoch costs O(length^2) decoder positions per sentence
    env = {"WMT_RAW": str(raw), "BPE_TOKENS": "300", "EXTRA_TRAIN": "--max-update 30 --num-workers 0",
           "EXTRA_CMLM": TINY_TRANSFORMER + " --lr 0.01 --warmup-updates 1 --warmup-init-lr 0.01"
                                            " --length-loss-factor 1",
           "EXTRA_MH": "--mh-burn-in 1 --mh-epochs 1", "CHAINS": "2", "SUBSET": "20", "EVAL_SETS": "full"}
    proc = recipe(WMT, work, env=env)
    return work, proc.stdout, env


@pytest.mark.slow
def test_wmt_recipe_end_to_end(wmt):
    work, out, _ = wmt
    stats = json.load(open(work / "prep" / "stats.json"))
    assert 1500 <= stats["train"] <= 1600 and stats["valid"] == 100 and stats["test"] == 60
    assert "20 pairs with a source of at most 20 words" in out
    assert all(len(line.split()) <= 20 for line in lines(work / "prep" / "tok" / "test.de")
               if line in set(lines(work / "prep" / "test20.de")))
    assert "num_updates 30" in open(work / "logs" / "cmlm.log").read()
    for name in ("warm_start", "mask_predict", "gibbs", "local", "raw"):
        # two batches of fairseq-generate (with --remove-bpe, the dictionary grows after the first)
        assert count_hypotheses(work / "gen" / f"{name}.full.txt") == 60, name
        assert json.load(open(work / "gen" / f"{name}.full.json"))["n_sentences"] == 60
    assert len(lines(work / "gen" / "local.full.jsonl")) == 60  # the sampler's statistics, one line a sentence
    assert (work / "data-bin-20" / "test.de-en.de.bin").exists()


@pytest.mark.slow
def test_wmt_decodes_the_users_data_and_cmlm(wmt, tmp_path):
    """DATA= and CMLM= (a user's binarized data and trained CMLM): nothing is downloaded,
    prepared or trained, and the baselines and a sampler decode the given model on the full
    test set."""
    work, _, env = wmt
    mine = tmp_path / "work"
    given = {"DATA": work / "data-bin", "CMLM": work / "cmlm" / "checkpoint_last.pt"}
    env = dict(env, MH_RUNS="raw", **{k: str(v) for k, v in given.items()})
    out = recipe(WMT, mine, env=env).stdout
    assert out.count(f"# DATA={given['DATA']} given: nothing to make") == 3
    assert f"# CMLM={given['CMLM']} given: nothing to make" in out and "subset20 skipped" in out
    assert not any((mine / d).exists() for d in ("orig", "raw", "prep", "data-bin", "cmlm"))
    for name in ("warm_start", "mask_predict", "raw"):
        assert json.load(open(mine / "gen" / f"{name}.full.json"))["n_sentences"] == 60, name


def test_wmt_dry_run_prints_the_paper_settings(tmp_path):
    out = recipe(WMT, tmp_path / "w", "--dry-run", env={"NGPU": "1"}).stdout
    assert "test-full/newstest2014-deen-src.en.sgm" in out and "--normalize --aggressive" in out
    assert "--arch cmlm_transformer" in out and "--fp16" in out and "--update-freq 16" in out
    assert "--max-update 300000" in out and "--warmup-updates 10000" in out
    assert "--mh-chains 5 --nbest 1 --mh-proposal-temperature 0.8" in out
    # the headline runs: annealed to the floor, each chain's best state (what passed Mask-Predict)
    assert "--mh-energy local --mh-accept-all-epochs 2 --mh-anneal-floor-at 0.6 --mh-output best" in out
    assert "--mh-energy raw --mh-accept-all-epochs 2 --mh-anneal-floor-at 0.6 --mh-output best" in out
    assert "--mh-target-anneal 0.02" not in out  # Table 6.6's schedule only when asked for
    assert "--mh-kernel gibbs" in out and "--iter-decode-max-iter 10" in out
    out = recipe(WMT, tmp_path / "w", "--dry-run", "--stage", "mh", env={"MH_RUNS": "raw_table66"}).stdout
    assert "--mh-energy raw --mh-target-anneal 0.02 --mh-accept-all-epochs 2" in out
    out = recipe(WMT, tmp_path / "w", "--dry-run", "--to", "prepare", env={"PAIR": "ro-en"}).stdout
    assert "--src ro --tgt en" in out and "--romanian" in out and "newstest2016-roen-src.ro.sgm" in out


def test_wmt_takes_the_users_data_and_cmlm(tmp_path):
    """DATA= and CMLM=: download, prepare, binarize and cmlm make nothing, subset20 says why it
    cannot select the (20) subset, and the baselines and samplers decode the given model on the
    given data's full test set; asking for the (20) subset then is one line, exit 2."""
    data, cmlm = tmp_path / "bin", tmp_path / "cmlm.pt"
    env = {"DATA": str(data), "CMLM": str(cmlm)}
    out = recipe(WMT, tmp_path / "w", "--dry-run", env=env).stdout
    assert out.count(f"# DATA={data} given: nothing to make") == 3
    assert f"# CMLM={cmlm} given: nothing to make" in out and "subset20 skipped" in out
    assert "wget" not in out and "fairseq-train" not in out and "fairseq-preprocess" not in out
    generate = [line for line in out.splitlines() if line.startswith("fairseq-generate")]
    assert generate and all(line.startswith(f"fairseq-generate {data} ") and f"--path {cmlm}" in line
                            for line in generate)
    with pytest.raises(AssertionError, match="EVAL_SETS=len20 needs the raw test text"):
        recipe(WMT, tmp_path / "w", "--dry-run", env=dict(env, EVAL_SETS="len20"))


# --------------------------------------------------------------------------- WikiText-103

@pytest.fixture(scope="module")
def wikitext(real_data, tmp_path_factory):
    """wikitext-103/wiki.{train,valid,test}.tokens from WikiText-2: a quarter of its valid
    split cut at article boundaries into train and valid, a tenth of its test split;
    then the recipe."""
    raw, wt2 = tmp_path_factory.mktemp("wt_raw"), os.path.join(real_data, "wikitext-2")
    valid, test = (open(os.path.join(wt2, f"{s}.txt"), encoding="utf-8").read().splitlines() for s in ("valid", "test"))
    valid = valid[: len(valid) // 4]
    heading = [i for i, line in enumerate(valid) if re.match(r"^ = [^=].* = $", line)][-2]  # two last articles
    train, valid = valid[:heading], valid[heading:]
    for name, rows in (("train", train), ("valid", valid), ("test", test[: len(test) // 10])):
        write(str(raw / f"wiki.{name}.tokens"), rows)
    work = tmp_path_factory.mktemp("wt") / "work"
    env = {"WIKITEXT_RAW": str(raw), "VOCAB": "2000", "PREFIX": "24", "CONT": "8", "NEGATIVES": "2", "NUM_NEG": "2",
           "EVAL_SAMPLES": "2", "EVAL_PREFIXES": "20", "MAX_LEN": "20", "MODELS": "mgs_lm",
           "EXTRA_TRAIN": TWO_UPDATES,
           "EXTRA_LM": "--decoder-layers 1 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 "
                       "--decoder-attention-heads 2 --max-tokens 2048 --tokens-per-sample 512 --update-freq 1",
           "EXTRA_EBM": "--encoder-layers 1 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 "
                        "--encoder-attention-heads 2 --update-freq 1"}
    proc = recipe(WIKITEXT, work, *all_stages_but(WIKITEXT, "mgs_edit"), env=env)
    return work, proc.stdout, env


@pytest.mark.slow
def test_wikitext_recipe_end_to_end(wikitext):
    work, out, _ = wikitext
    stats = json.load(open(work / "data" / "stats.json"))
    for split in ("train", "valid", "test"):
        assert stats[split] > 0 and f"{split}: {stats[split]} (prefix, continuation) pairs" in out
    assert stats["context_size"] == 10
    for name in ("lm", "mgs_lm", "ebm_lm", "ebm_unit", "ebm_bit"):
        assert (work / name / "checkpoint_last.pt").exists(), name
    assert "cost_lm" in open(work / "logs" / "mgs_lm.log").read()
    scores = json.load(open(work / "gen" / "mgs_lm.test.json"))
    assert scores["n_sentences"] == stats["test"] and scores["nonterm"] is not None
    assert (work / "negatives" / "train.negatives.pt").exists() and (work / "negatives" / "valid.negatives.pt").exists()
    for v in ("unit", "bit"):
        result = json.load(open(work / "gen" / f"ebm_{v}.json"))
        assert result, v
        assert count_hypotheses(work / "gen" / f"ebm_{v}.samples") > 0


@pytest.mark.slow
def test_wikitext_fine_tunes_the_users_data_and_models(wikitext, tmp_path):
    """DATA=, LM=, EBM_DATA= and BASE_LM=: MGS fine-tunes the given LM on the given data,
    and the negatives and an energy come from the given base LM on the given EBM data."""
    work, _, env = wikitext
    mine = tmp_path / "work"
    given = {"DATA": work / "data" / "bin", "LM": work / "lm" / "checkpoint_last.pt",
             "EBM_DATA": work / "ebm_data" / "bin", "BASE_LM": work / "ebm_lm" / "checkpoint_last.pt"}
    env = dict(env, **{k: str(v) for k, v in given.items()})
    stages = ["download", "prepare", "lm", "mgs_lm", "ebm_data", "ebm_lm", "negatives", "ebm_unit"]
    out = recipe(WIKITEXT, mine, *[a for name in stages for a in ("--stage", name)], env=env).stdout
    for name in given:
        assert f"# {name}={given[name]} given: nothing to make" in out, name
    assert not any((mine / d).exists() for d in ("raw", "orig", "data", "lm", "ebm_data", "ebm_lm"))
    assert f"'finetune_from_model': '{given['LM']}'" in open(mine / "logs" / "mgs_lm.log").read()
    assert (mine / "negatives" / "train.negatives.pt").exists() and (mine / "ebm_unit" / "checkpoint_last.pt").exists()
    assert f"'residual_base_lm': '{given['BASE_LM']}'" in open(mine / "logs" / "ebm_unit.log").read()


def test_wikitext_dry_run_prints_the_paper_settings(tmp_path):
    out = recipe(WIKITEXT, tmp_path / "w", "--dry-run", env={"NGPU": "4"}).stdout
    assert "wikitext-103-v1.zip" in out and "--context-size 10 --vocab-size 50000" in out
    assert "--arch transformer_lm_gpt" in out and "--max-tokens 1024" in out and "--max-update 400000" in out
    assert "--criterion mgs --mgs-candidates 4 --mgs-mixture 0.5 --mgs-alpha 1.0" in out
    assert "--validate-interval-updates 100" in out and "--patience 10" in out
    assert "--max-len-b 510" in out and "--max-len 500" in out
    assert "--residual-prefix-len 120 --residual-continuation-len 40" in out and "--criterion residual_nce" in out
    train = [line for line in out.splitlines() if line.startswith("fairseq-train")]
    assert len(train) == 6 and all("--distributed-world-size 4" in line for line in train)
    assert [line.split("--save-dir ")[1].split()[0].rsplit("/", 1)[1] for line in train if "--fp16" in line] == [
        "ebm_lm", "ebm_unit", "ebm_bit"]  # mixed precision for the EBM stages only


def test_wikitext_takes_the_users_data_and_models(tmp_path):
    """DATA=, LM=, EBM_DATA= and BASE_LM=: download, prepare, lm, ebm_data and ebm_lm make
    nothing, MGS fine-tunes the given LM and the residual EBM stages read the given base LM."""
    given = {"DATA": tmp_path / "bin", "LM": tmp_path / "lm.pt", "EBM_DATA": tmp_path / "ebm_bin",
             "BASE_LM": tmp_path / "base.pt"}
    out = recipe(WIKITEXT, tmp_path / "w", "--dry-run", env={k: str(v) for k, v in given.items()}).stdout
    assert out.count(f"# DATA={given['DATA']} given: nothing to make") == 2  # download, prepare
    for name in ("LM", "EBM_DATA", "BASE_LM"):
        assert out.count(f"# {name}={given[name]} given: nothing to make") == 1 + (name == "EBM_DATA"), name
    assert "wget" not in out and "prepare_wikitext_completion.py" not in out
    train = [line for line in out.splitlines() if line.startswith("fairseq-train")]
    assert [line.split("--save-dir ")[1].split()[0].rsplit("/", 1)[1] for line in train] == [
        "mgs_lm", "mgs_edit", "ebm_unit", "ebm_bit"]
    assert all(f"--finetune-from-model {given['LM']}" in line for line in train[:2])
    assert all(f"--residual-base-lm {given['BASE_LM']}" in line and f"fairseq-train {given['EBM_DATA']}" in line
               for line in train[2:])
    # only the completion data given: the raw text is still fetched for the EBM data
    out = recipe(WIKITEXT, tmp_path / "w", "--dry-run", "--to", "prepare", env={"DATA": str(given["DATA"])}).stdout
    assert "wget" in out and "prepare_wikitext_completion.py" not in out
