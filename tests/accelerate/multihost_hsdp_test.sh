#!/usr/bin/env bash
# Hybrid sharding across two "hosts" for real: two network namespaces joined by a veth pair
# (10.252.X.1 and .2), one accel-run of 2 processes per namespace, ZeRO-3 on the mesh
# dp_replicate 2 x dp_shard 2 (each machine holds one shard group; the replicas face each other
# across the link), as a user would run it on two machines:
#   1. the 2-host HSDP run prints the same losses and final weights as one process (1e-10
#      relative: float64, the same global batch);
#   2. what crosses the link per step is the all-reduce of one shard per replica pair, not the
#      model: the veth byte counters of a run of STEPS steps minus those of a run of 0 steps (the
#      same start-up, state gathering and shutdown), divided by STEPS, lie within
#      [0.9, 1.35] x 2 x the model's bytes (two pairs, each all-reducing a shard of half the model:
#      every rank must receive the other's half-model of values at least once, TCP's headers and
#      acknowledgements on top), and below 0.6 x what the flat ZeRO-3 mesh (dp_shard 4 over both
#      machines: all-gathers and reduce-scatters of the whole model cross the link) sends.
# Needs root and `ip netns`; otherwise exits 77 (skipped). Everything it creates (namespaces,
# veth, processes, files) is removed on every exit path.
#
#   multihost_hsdp_test.sh <accel-run> <mh_hsdp>
# Figures are printed as "FIGURE name value" lines.
set -u

ACCEL_RUN=${1:?usage: multihost_hsdp_test.sh <accel-run> <mh_hsdp>}
PROG=${2:?usage: multihost_hsdp_test.sh <accel-run> <mh_hsdp>}
STEPS=6
START_LIMIT_S=180       # generous: the machine running the suite may be loaded
TOLERANCE=1e-10         # relative

. "$(dirname "$0")/../common/netns_pair.sh"
[ -x "$ACCEL_RUN" ] || { echo "FAIL: no accel-run at $ACCEL_RUN"; exit 1; }
[ -x "$PROG" ] || { echo "FAIL: no training program at $PROG"; exit 1; }
netns_pair hs 10.252

TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
PORT=$(( 20000 + (ID + 7919) % 20000 ))

# Bytes sent by both ends of the link so far.
link_bytes() {
  local a b
  a=$(ip netns exec "$NS0" cat "/sys/class/net/$VETH0/statistics/tx_bytes")
  b=$(ip netns exec "$NS1" cat "/sys/class/net/$VETH1/statistics/tx_bytes")
  echo $(( a + b ))
}


# two_hosts <tag> <mesh flags> <program args...>: one accel-run per namespace, both waited for;
# sets BYTES to what crossed the link meanwhile; the logs are $TMP/<tag>.0.log and .1.log.
two_hosts() {
  local tag=$1 flags=$2 m ns pids=() rcs=()
  shift 2
  local before
  before=$(link_bytes)
  for m in 0 1; do
    ns=$NS0
    [ "$m" = 1 ] && ns=$NS1
    # shellcheck disable=SC2086
    setsid ip netns exec "$ns" env ACCEL_RENDEZVOUS_TOKEN="$TOKEN" OMP_NUM_THREADS=1 \
      "$ACCEL_RUN" launch --num_machines 2 --machine_rank "$m" --main_process_ip "$A0" \
      --main_process_port "$PORT" --num_processes 4 --cpu --zero_stage 3 $flags "$PROG" "$@" \
      >"$TMP/$tag.$m.log" 2>&1 &
    PIDS+=($!)
    pids+=($!)
  done
  local deadline
  deadline=$(awk -v n="$(now)" -v l="$START_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')
  for m in 0 1; do
    wait_exit "${pids[$m]}" "$deadline"
    rcs+=("$RC")
  done
  BYTES=$(( $(link_bytes) - before ))
  if [ "${rcs[0]}" != 0 ] || [ "${rcs[1]}" != 0 ]; then
    echo "--- machine 0"; cat "$TMP/$tag.0.log"; echo "--- machine 1"; cat "$TMP/$tag.1.log"
    fail "the 2-host run '$tag' ($flags) ended with ${rcs[0]} / ${rcs[1]}"
    return 1
  fi
  return 0
}

# Rank 0's lines without accel-run's "[rank0]: " prefix.
lines() { sed -n 's/^\(\[rank0\]: \)\{0,1\}//p' "$1"; }
# max_rel <file a> <file b>: the largest relative difference between the numbers of matching
# "step K loss X" and "weights A B" lines, or "misaligned".
max_rel() {
  paste -d' ' <(lines "$1" | grep -E '^(step|weights) ') <(lines "$2" | grep -E '^(step|weights) ') |
    awk -v n="$STEPS" '
      $1 == "step" { if ($2 != $6 || $5 != "step") bad = 1; cmp($4, $8); k++ }
      $1 == "weights" { if ($4 != "weights") bad = 1; cmp($2, $5); cmp($3, $6); w++ }
      function cmp(a, b,   d, m) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a;
        r = d / (m > 1e-300 ? m : 1e-300); if (r > worst) worst = r }
      END { if (bad || k != n || w != 1) print "misaligned"; else printf "%.3g", worst }'
}

# ---------------------------------------------------------------- 1. one process
T1=$(now)
"$ACCEL_RUN" launch --num_processes 1 --cpu --zero_stage 3 --main_process_port "$(( PORT + 1 ))" \
  "$PROG" --steps "$STEPS" >"$TMP/one.log" 2>&1 &
ONE=$!
PIDS+=($ONE)
wait_exit "$ONE" "$(awk -v n="$(now)" -v l="$START_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')"
[ "$RC" = 0 ] || { cat "$TMP/one.log"; fail "the 1-process run ended with $RC"; }
echo "FIGURE one_process_run_s $(elapsed "$T1")"
MODEL_BYTES=$(lines "$TMP/one.log" | awk '$1 == "params" { print $3 }')
[ -n "$MODEL_BYTES" ] || { cat "$TMP/one.log"; echo "FAIL: no params line"; exit 1; }
echo "model: $MODEL_BYTES bytes of float64 parameters"

# ---------------------------------------------------------------- 2. HSDP on two hosts
T1=$(now)
HSDP="--dp_replicate_size 2 --dp_shard_size 2"
two_hosts hsdp "$HSDP" --steps "$STEPS" && HSDP_BYTES=$BYTES
echo "FIGURE two_host_hsdp_run_s $(elapsed "$T1")"
if [ "$FAILED" = 0 ]; then
  lines "$TMP/hsdp.0.log" | grep -E '^mesh ' | head -1
  rel=$(max_rel "$TMP/one.log" "$TMP/hsdp.0.log")
  echo "FIGURE hsdp_vs_one_process_max_relative_difference $rel"
  if [ "$rel" = misaligned ] || awk -v m="$rel" -v t="$TOLERANCE" 'BEGIN { exit !(m > t) }'; then
    paste <(lines "$TMP/one.log") <(lines "$TMP/hsdp.0.log")
    fail "the 2-host HSDP run differs from one process (max relative difference $rel)"
  fi
fi
two_hosts hsdp0 "$HSDP" --steps 0 && HSDP0_BYTES=$BYTES

# ---------------------------------------------------------------- 3. flat ZeRO-3 on two hosts
FLAT="--dp_shard_size 4"
two_hosts flat "$FLAT" --steps "$STEPS" && FLAT_BYTES=$BYTES
two_hosts flat0 "$FLAT" --steps 0 && FLAT0_BYTES=$BYTES

if [ "$FAILED" = 0 ]; then
  hsdp_step=$(( (HSDP_BYTES - HSDP0_BYTES) / STEPS ))
  flat_step=$(( (FLAT_BYTES - FLAT0_BYTES) / STEPS ))
  expect=$(( 2 * MODEL_BYTES ))
  echo "FIGURE hsdp_link_bytes_per_step $hsdp_step"
  echo "FIGURE flat_zero3_link_bytes_per_step $flat_step"
  echo "FIGURE hsdp_link_bytes_per_step_over_two_model_bytes $(awk -v a="$hsdp_step" -v b="$expect" 'BEGIN { printf "%.3f", a / b }')"
  echo "FIGURE hsdp_over_flat_link_bytes $(awk -v a="$hsdp_step" -v b="$flat_step" 'BEGIN { printf "%.3f", a / b }')"
  awk -v a="$hsdp_step" -v e="$expect" 'BEGIN { exit !(a >= 0.9 * e && a <= 1.35 * e) }' ||
    fail "HSDP sent $hsdp_step bytes per step across the link; the all-reduce of one shard per replica pair is about $expect (allowed 0.9x to 1.35x)"
  awk -v a="$hsdp_step" -v f="$flat_step" 'BEGIN { exit !(a < 0.6 * f) }' ||
    fail "HSDP sent $hsdp_step bytes per step across the link, not clearly less than flat ZeRO-3's $flat_step"
fi

echo "FIGURE multihost_hsdp_test_s $(elapsed "$T_START")"
[ "$FAILED" = 0 ] && echo "PASS" || exit 1
