# Shared helpers for the example recipes; source it, do not run it.

# throttle N: wait until fewer than N of this shell's background jobs run
throttle() {
  while [ "$(jobs -rp | wc -l)" -ge "$1" ]; do wait -n; done
}

# finished LOG: true when LOG, a fairseq-train log, records a finished run (fairseq's
# "done training"). The CPU-scale scripts skip such a run when rerun, and rerun one that
# was interrupted: fairseq-train resumes from its save directory's checkpoint_last.pt
# (fine-tunes pass --finetune-from-model, which only the first launch loads).
finished() {
  grep -qs "done training in" "$1"
}

# defaults NAME=VALUE...: the recipe's environment settings: each NAME keeps the value the
# environment gives it and takes VALUE where it is unset or empty (NAME=${NAME:-VALUE}), in order.
# The caller expands every VALUE before the first is set: a default that reads another NAME of
# the same call goes in a later call
defaults() {
  local kv var
  for kv; do
    var=${kv%%=*}
    [ -n "${!var:-}" ] || printf -v "$var" '%s' "${kv#*=}"
  done
}

# seed_spec NAME TEMPLATE: scripts/score/compare_runs.py's "NAME=FILE,FILE,..." argument, one FILE per seed in
# $SEEDS: TEMPLATE with every @SEED@ replaced by the seed
seed_spec() {
  local files=() seed
  for seed in $SEEDS; do files+=("${2//@SEED@/$seed}"); done
  echo "$1=$(IFS=,; echo "${files[*]}")"
}

# ---------------------------------------------------------------------------
# Scheduled-sampling systems under the Goyal thesis's protocol (section 3.3.3), shared by
# examples/dss/ner.sh and examples/dss/multi30k.sh. Systems: ce, ss_greedy, ss_sample,
# soft_greedy_fixed, soft_greedy_annealed, soft_sample_fixed, soft_sample_annealed, always
# (soft argmax, annealed alpha, eps = 0 after the teacher-forced first epoch). CONFIG names
# (no dots): base (ce), kK (hard), kK_aA (alpha fixed at A), kK_gG (alpha 1, x G per epoch),
# gG (always).
# ---------------------------------------------------------------------------
DSS_SYSTEMS="ce ss_greedy ss_sample soft_greedy_fixed soft_greedy_annealed soft_sample_fixed soft_sample_annealed"
DSS_SYSTEMS+=" always"

# dss_configs SYSTEM: its tuning grid, from KS, FIXED_ALPHAS and GROWTHS
dss_configs() {
  local k a
  case $1 in
    ce) echo base ;;
    ss_*) for k in $KS; do echo "k$k"; done ;;
    *_fixed) for k in $KS; do for a in $FIXED_ALPHAS; do echo "k${k}_a$a"; done; done ;;
    *_annealed) for k in $KS; do for a in $GROWTHS; do echo "k${k}_g$a"; done; done ;;
    always) for a in $GROWTHS; do echo "g$a"; done ;;
    *) echo "$0: unknown system $1" >&2; return 1 ;;
  esac
}

# dss_criterion SYSTEM CONFIG: the criterion options (teacher forcing in epoch 1, then eps =
# k / (k + exp(t / k)) per epoch); CE as cross_entropy, or (DSS_CE_AS_DSS=1) as the DSS
# criterion with eps = 1 throughout, which is exactly cross-entropy and lets a run resume a
# shared warm-up checkpoint with its optimizer state (fairseq restores it only for the same
# criterion class)
dss_criterion() {
  local sys=$1 cfg=$2 k="" a="" g="" mode out
  [[ $cfg =~ k([0-9]+) ]] && k=${BASH_REMATCH[1]}
  [[ $cfg =~ _a([0-9]+) ]] && a=${BASH_REMATCH[1]}
  [[ $cfg =~ g([0-9]+) ]] && g=${BASH_REMATCH[1]}
  out="--criterion differentiable_scheduled_sampling --dss-schedule-unit epoch"
  case $sys in
    ce) if [ "${DSS_CE_AS_DSS:-0}" = 1 ]; then echo "$out --dss-warmup 1e12"; else echo "--criterion cross_entropy"; fi
        return ;;
    ss_greedy) mode=hard-argmax ;;
    ss_sample) mode=hard-sample ;;
    soft_greedy_*|always) mode=soft-argmax ;;
    soft_sample_*) mode=soft-sample ;;
  esac
  out+=" --dss-warmup 1 --dss-mode $mode"
  if [ "$sys" = always ]; then out+=" --dss-schedule always"
  else out+=" --dss-schedule inverse_sigmoid --dss-decay-k $k"; fi
  [ -z "$a" ] || out+=" --dss-alpha $a"
  [ -z "$g" ] || out+=" --dss-alpha 1 --dss-alpha-growth $g"
  echo "$out"
}

# dss_protocol WORK RUN_FN TABLE_ARGS...: the stages named in STAGES over the systems in ONLY,
# RUN_FN SYSTEM CONFIG SEED training and scoring one run (JOBS at a time, in the background):
#   tune      seed TUNE_SEED (the first of SEEDS) of every system x config
#   restarts  the other SEEDS of each system's best-on-dev config, and of the best alpha at
#             every k for soft_greedy_annealed (Table 3.2)
#   table     examples/dss/table.py --protocol TABLE_ARGS: the best-on-dev restart and the
#             mean +- std of all restarts per system, the tuning grid, Table 3.2
dss_protocol() {
  local work=$1 run_fn=$2 sys cfg seed k picks tune_seed
  shift 2
  read -r tune_seed _ <<< "$SEEDS"
  if [[ " $STAGES " == *" tune "* ]]; then
    for sys in $ONLY; do
      for cfg in $(dss_configs "$sys"); do
        throttle "$JOBS"
        "$run_fn" "$sys" "$cfg" "$tune_seed" &
      done
    done
    wait
  fi
  if [[ " $STAGES " == *" restarts "* ]]; then
    for seed in $SEEDS; do
      [ "$seed" = "$tune_seed" ] && continue
      for sys in $ONLY; do
        picks=$("$PYTHON" examples/dss/table.py "$work" "$@" --select "$sys" --tune-seed "$tune_seed")
        if [ "$sys" = soft_greedy_annealed ]; then
          for k in $KS; do picks+=" $("$PYTHON" examples/dss/table.py "$work" "$@" --select "$sys" \
            --tune-seed "$tune_seed" --prefix "k${k}_")"; done
        fi
        for cfg in $(echo "$picks" | tr ' ' '\n' | sort -u); do
          throttle "$JOBS"
          "$run_fn" "$sys" "$cfg" "$seed" &
        done
      done
    done
    wait
  fi
  if [[ " $STAGES " == *" table "* ]]; then
    # shellcheck disable=SC2086
    "$PYTHON" examples/dss/table.py "$work" "$@" --protocol --grid --tune-seed "$tune_seed" --markdown $ONLY
    if [[ " $ONLY " == *" soft_greedy_annealed "* ]]; then
      echo
      echo "Table 3.2: soft_greedy_annealed at each k (its best alpha on dev)"
      for k in $KS; do
        "$PYTHON" examples/dss/table.py "$work" "$@" --protocol --tune-seed "$tune_seed" --prefix "k${k}_" \
          --markdown soft_greedy_annealed | tail -n 1
      done
    fi
  fi
}

# completion_eval BIN CKPT SCORER MAX_LEN OUT TASK-ARGS...: the text-completion evaluation of
# examples/mgs/demo.sh and examples/mgs/completion_tables.sh. CKPT's greedy continuations of BIN's test
# prefixes, at most MAX_LEN tokens (OUT.gen); scripts/score/score.py on them (OUT.scores.json); and the LM
# cost under the frozen model SCORER (greedy, up to 1.3 x the longest reference) with the test
# perplexity (scripts/inspect/validate_criterion.py, OUT.test.log). Without --required-batch-size-multiple 1
# fairseq would drop the N mod 8 longest lines. Needs PYTHON.
completion_eval() {
  local bin=$1 ckpt=$2 scorer=$3 max_len=$4 out=$5
  shift 5
  fairseq-generate "$bin" --user-dir "$(fairseq-ext-dir)" "$@" --path "$ckpt" --gen-subset test --beam 1 \
    --batch-size 100 --required-batch-size-multiple 1 --max-len-b $((max_len + 3)) > "$out.gen" 2> "$out.gen.log"
  "$PYTHON" scripts/score/score.py "$out.gen" --max-len "$max_len" --json "$out.scores.json" > "$out.score.log" 2>&1
  "$PYTHON" scripts/inspect/validate_criterion.py \
    "{'_name': 'mgs', 'mgs_task_loss': 'lm', 'mgs_score_model': '$scorer'}" "$bin" --user-dir "$(fairseq-ext-dir)" "$@" \
    --path "$ckpt" --valid-subset test --max-tokens 4096 --required-batch-size-multiple 1 > "$out.test.log" 2>&1
}

# ---------------------------------------------------------------------------
# Staged recipes (examples/mgs/iwslt14_de_en.sh, examples/mh_sampler/wmt.sh, examples/mgs/wikitext103.sh)
#
#   RECIPE WORK_DIR [--stage NAME]... [--from NAME] [--to NAME] [--force] [--dry-run] [--list]
#
# A recipe is an ordered list of named stages (STAGES). By default every stage
# runs, in order. --stage NAME (repeatable) runs only the named stages; --from /
# --to run a contiguous range. A stage that finishes writes WORK_DIR/.stages/NAME;
# a later call skips it ("done, skipped"), so a recipe is idempotent and resumes
# at the first unfinished stage (fairseq-train itself resumes from the stage's
# checkpoint_last.pt). --force reruns the selected stages. --dry-run prints every
# command of the selected stages (already finished ones included) and runs
# nothing. --list prints the stages and which are done.
#
# In the recipe:  STAGES=(a b c); PATH_VARS=(RAW_DIR DATA); recipe_args "$@"
#                 if stage a; then given DATA || run ...; stage_done a; fi
#                 (for a stage of one command: stage_unless_given a DATA run ...)
# A path variable the user sets (a binarized data directory, a trained checkpoint)
# stands for what a stage would make: `given VAR` says so and the stage makes nothing.
# ---------------------------------------------------------------------------

# recipe_args ARGS...: parse the command line above (sets WORK, DRY_RUN, SELECTED); make
# WORK and the environment variables named in PATH_VARS absolute; cd to the repository
# root (so scripts/ resolves); devices_init; WORKERS (CPU count) and PYTHON defaults
recipe_args() {
  local from="" to="" only=() list=0 force=0
  WORK="" DRY_RUN=0 FORCE=0
  while [ $# -gt 0 ]; do
    case $1 in
      --stage) only+=("${2:?--stage needs a name}"); shift ;;
      --from) from=${2:?--from needs a name}; shift ;;
      --to) to=${2:?--to needs a name}; shift ;;
      --dry-run) DRY_RUN=1 ;;
      --force) force=1 ;;
      --list) list=1 ;;
      -h|--help) recipe_usage; exit 0 ;;
      -*) echo "$0: unknown option $1" >&2; recipe_usage >&2; exit 2 ;;
      *) [ -z "$WORK" ] || { echo "$0: one WORK_DIR only, got '$WORK' and '$1'" >&2; exit 2; }; WORK=$1 ;;
    esac
    shift
  done
  [ -n "$WORK" ] || { recipe_usage >&2; exit 2; }
  WORK=$(abspath "$WORK")
  FORCE=$force
  local name i lo=0 hi=$((${#STAGES[@]} - 1))
  for name in "${only[@]}" $from $to; do stage_index "$name" > /dev/null; done
  [ -z "$from" ] || lo=$(stage_index "$from")
  [ -z "$to" ] || hi=$(stage_index "$to")
  SELECTED=()
  for i in "${!STAGES[@]}"; do
    name=${STAGES[$i]}
    if [ ${#only[@]} -gt 0 ]; then
      [[ " ${only[*]} " == *" $name "* ]] && SELECTED+=("$name")
    elif [ "$i" -ge "$lo" ] && [ "$i" -le "$hi" ]; then
      SELECTED+=("$name")
    fi
  done
  if [ "$list" = 1 ]; then
    for name in "${STAGES[@]}"; do
      printf '%-16s %s\n' "$name" "$([ -e "$WORK/.stages/$name" ] && echo done || echo -)"
    done
    exit 0
  fi
  [ "$DRY_RUN" = 1 ] || mkdir -p "$WORK/.stages"
  GIVEN=" "
  for name in ${PATH_VARS[@]+"${PATH_VARS[@]}"}; do
    [ -z "${!name:-}" ] || { printf -v "$name" '%s' "$(abspath "${!name}")"; GIVEN+="$name "; }
  done
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  WORKERS=${WORKERS:-$(getconf _NPROCESSORS_ONLN)}
  PYTHON=${PYTHON:-python}
  devices_init
}

is_given() {  # VAR...: true when the user set every VAR (one of PATH_VARS)
  local name
  for name; do [[ "$GIVEN" == *" $name "* ]] || return 1; done
}

given() {  # VAR...: true when the user set every VAR (printing so): the stage has nothing to make
  is_given "$@" || return 1
  local name
  for name; do echo "# $name=${!name} given: nothing to make"; done
}

# stage_unless_given NAME VAR CMD ARGS...: the stage NAME (when stage NAME is true) whose one
# command CMD ARGS... (run ..., run_log ..., train ...) makes what VAR names, and makes nothing
# when the user gave VAR (given VAR); then stage_done NAME. The caller expands ARGS whether or
# not the stage runs: they must have no side effects
stage_unless_given() {
  local name=$1 var=$2
  shift 2
  stage "$name" || return 0
  given "$var" || "$@"
  stage_done "$name"
}

abspath() {  # PATH -> absolute (the recipes cd to the repository root)
  case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac
}

# recipe_usage: the recipe's header comment (from line 2 to the first line that is not a comment)
recipe_usage() {
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  echo "stages: ${STAGES[*]}"
}

stage_index() {  # NAME -> its position in STAGES (an unknown name is an error)
  local i
  for i in "${!STAGES[@]}"; do [ "${STAGES[$i]}" = "$1" ] && { echo "$i"; return 0; }; done
  echo "$0: unknown stage '$1' (stages: ${STAGES[*]})" >&2
  exit 2
}

# stage NAME: true when NAME is selected and (unless --force or --dry-run) not done yet
stage() {
  [[ " ${SELECTED[*]} " == *" $1 "* ]] || return 1
  if [ -e "$WORK/.stages/$1" ] && [ "$FORCE" = 0 ]; then
    if [ "$DRY_RUN" = 1 ]; then echo "# stage $1 (done; a real run skips it)"; return 0; fi
    echo "==> stage $1: done, skipped"
    return 1
  fi
  if [ "$DRY_RUN" = 1 ]; then echo "# stage $1"; else echo "==> $(date -u +%H:%M:%S) stage $1"; fi
}

stage_done() {  # NAME: mark it finished
  [ "$DRY_RUN" = 1 ] || touch "$WORK/.stages/$1"
}

# quote ARGS...: the arguments as one shell line (single quotes where needed)
quote() {
  local out=() a
  for a in "$@"; do
    if [[ -z "$a" || "$a" =~ [^][A-Za-z0-9_./:=,@%+{}-] ]]; then out+=("'${a//\'/\'\\\'\'}'"); else out+=("$a"); fi
  done
  echo "${out[*]}"
}

# run CMD ARGS...: print the command under --dry-run, run it otherwise
run() {
  if [ "$DRY_RUN" = 1 ]; then quote "$@"; return 0; fi
  "$@"
}

# run_log LOG CMD ARGS...: as run, with stdout and stderr to LOG; on failure show its end
run_log() {
  local log=$1; shift
  if [ "$DRY_RUN" = 1 ]; then echo "$(quote "$@") > $(quote "$log") 2>&1"; return 0; fi
  mkdir -p "$(dirname "$log")"
  "$@" > "$log" 2>&1 || { echo "failed: $(quote "$@")" >&2; tail -n 30 "$log" >&2; return 1; }
}

# ---------------------------------------------------------------------------
# Devices. NGPU: the number of GPUs, from the environment: $NGPU if set, else the
# entries of $CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`, else 0.
# DEVICE: fairseq options for that count: --cpu (0), nothing (1), or
# --distributed-world-size N (N > 1: fairseq starts one process per GPU);
# GEN_DEVICE: the same for fairseq-generate and scripts (one device: --cpu or nothing).
# FP16_ARGS: --fp16 when there is a GPU, unless FP16=0; stages whose paper used
# mixed precision add it.
# update_freq K: the --update-freq that keeps K x (one GPU's batch) per update on
# NGPU GPUs (K / NGPU, at least 1), so an update sees the paper's batch.
# ---------------------------------------------------------------------------
detect_gpus() {
  if [ -n "${NGPU:-}" ]; then
    echo "$NGPU"
  elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    local v=${CUDA_VISIBLE_DEVICES// /}
    if [ -z "$v" ] || [ "$v" = -1 ]; then echo 0; else echo "$v" | tr ',' '\n' | grep -c .; fi
  elif command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

devices_init() {
  NGPU=$(detect_gpus)
  [[ "$NGPU" =~ ^[0-9]+$ ]] || { echo "$0: NGPU must be a whole number, got '$NGPU'" >&2; exit 2; }
  if [ "$NGPU" = 0 ]; then DEVICE=(--cpu)
  elif [ "$NGPU" = 1 ]; then DEVICE=()
  else DEVICE=(--distributed-world-size "$NGPU"); fi
  GEN_DEVICE=()
  [ "$NGPU" != 0 ] || GEN_DEVICE=(--cpu)
  FP16_ARGS=()
  [ "$NGPU" = 0 ] || [ "${FP16:-1}" = 0 ] || FP16_ARGS=(--fp16)
  echo "# $(basename "$0"): $NGPU GPU(s): ${DEVICE[*]:-(one GPU)} ${FP16_ARGS[*]:-}; work dir $WORK"
}

# train STAGE DATA OPTIONS...: fairseq-train into WORK/STAGE, log WORK/logs/STAGE.log, with
# the device options and --update-epoch-batch-itr True (a resumed run sees the batches an
# uninterrupted one would: docs/distributed.md); EXTRA_TRAIN is appended last
train() {
  local name=$1 data=$2; shift 2
  # shellcheck disable=SC2086
  run_log "$WORK/logs/$name.log" fairseq-train "$data" --user-dir "$(fairseq-ext-dir)" "${DEVICE[@]}" \
    --update-epoch-batch-itr True --no-epoch-checkpoints --log-format simple --log-interval 100 --seed 1 "$@" \
    --save-dir "$WORK/$name" ${EXTRA_TRAIN:-}
}

update_freq() {  # K -> max(1, K / NGPU)
  local n=$(( NGPU > 0 ? $1 / NGPU : $1 ))
  echo $(( n > 0 ? n : 1 ))
}
