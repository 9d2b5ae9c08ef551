#!/usr/bin/env bash
# Two "hosts" for real: two network namespaces joined by a veth pair (10.251.X.1 and .2), one
# accel-run per namespace, as a user would run two machines:
#   1. a short 2-host training run must print the same losses as a 1-host run of the same world
#      size (2 processes on loopback);
#   2. a long 2-host run whose link is cut mid-run must end on both sides, non-zero, within 60 s,
#      each side naming the peer it lost;
#   3. the reported failure: both ranks advertise 127.0.0.1 (a host name that resolves to
#      loopback); both sides must fail within the init timeout (10 s here) + 30 s, naming the
#      peer and the address they could not use (it used to hang one side for 5x the timeout);
#   4. a link losing 30 % of its packets (netem, else an iptables `statistic` rule, on both veth
#      ends) under a model large enough for Gloo's ring: before, training crawled with stalls of
#      tens of seconds and no error, up to the 5-minute timeout; now the progress watchdog (or
#      the heartbeat) names the peer and its address, and both sides exit non-zero (the side
#      stuck inside a Gloo receive at its collective timeout, 30 s here). Skipped (the rest still
#      runs) where neither netem nor iptables works.
# Needs root and `ip netns`; otherwise exits 77 (skipped). Everything it creates (namespaces,
# veth, processes, files) is removed on every exit path.
#
#   multihost_test.sh <accel-run> <mh_train>
# Figures are printed as "FIGURE name value" lines.
set -u

ACCEL_RUN=${1:?usage: multihost_test.sh <accel-run> <mh_train>}
PROG=${2:?usage: multihost_test.sh <accel-run> <mh_train>}
SHORT_STEPS=12
CUT_LIMIT_S=60          # both sides must have exited this long after the cut
START_LIMIT_S=120       # generous: the machine running the suite may be loaded
LOSS_TOLERANCE=1e-5     # relative

. "$(dirname "$0")/../common/netns_pair.sh"
[ -x "$ACCEL_RUN" ] || { echo "FAIL: no accel-run at $ACCEL_RUN"; exit 1; }
[ -x "$PROG" ] || { echo "FAIL: no training program at $PROG"; exit 1; }
netns_pair mh 10.251

TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# Each namespace has its own port space: one port serves both runs' rendezvous.
PORT=$(( 20000 + ID % 20000 ))

# start_machine <rank> <log> <program args...>: one accel-run per namespace, in its own process
# group so that cleanup can end it with its workers; EXTRA_ENV (NAME=value ...) is added.
EXTRA_ENV=()
start_machine() {
  local m=$1 log=$2
  shift 2
  local ns=$NS0
  [ "$m" = 1 ] && ns=$NS1
  setsid ip netns exec "$ns" env ACCEL_RENDEZVOUS_TOKEN="$TOKEN" OMP_NUM_THREADS=1 "${EXTRA_ENV[@]}" \
    "$ACCEL_RUN" launch --num_machines 2 --machine_rank "$m" --main_process_ip "$A0" \
    --main_process_port "$PORT" --num_processes 2 --cpu "$PROG" "$@" >"$log" 2>&1 &
  PIDS+=($!)
}


# "step K loss X" lines (accel-run prefixes worker output with "[rank0]: ") as "K X".
losses() { sed -n 's/^\(\[rank0\]: \)\{0,1\}step \([0-9]*\) loss \([-+0-9.eE]*\)$/\2 \3/p' "$1"; }

# ---------------------------------------------------------------- 1. losses: 1 host vs 2 hosts
T1=$(now)
"$ACCEL_RUN" launch --num_processes 2 --cpu --main_process_port "$(( PORT + 1 ))" "$PROG" \
  --steps "$SHORT_STEPS" >"$TMP/one.log" 2>&1 &
ONE=$!
PIDS+=($ONE)
wait_exit "$ONE" "$(awk -v n="$(now)" -v l="$START_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')"
[ "$RC" = 0 ] || { cat "$TMP/one.log"; fail "the 1-host run ended with $RC"; }
echo "FIGURE one_host_short_run_s $(elapsed "$T1")"

T1=$(now)
start_machine 0 "$TMP/short0.log" --steps "$SHORT_STEPS"
P0=${PIDS[-1]}
start_machine 1 "$TMP/short1.log" --steps "$SHORT_STEPS"
P1=${PIDS[-1]}
DEADLINE=$(awk -v n="$(now)" -v l="$START_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')
wait_exit "$P0" "$DEADLINE"
rc0=$RC
wait_exit "$P1" "$DEADLINE"
rc1=$RC
echo "FIGURE two_host_short_run_s $(elapsed "$T1")"
if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
  echo "--- machine 0"; cat "$TMP/short0.log"; echo "--- machine 1"; cat "$TMP/short1.log"
  fail "the 2-host run ended with $rc0 / $rc1"
fi
losses "$TMP/one.log" >"$TMP/one.loss"
losses "$TMP/short0.log" >"$TMP/two.loss"
n1=$(wc -l <"$TMP/one.loss")
n2=$(wc -l <"$TMP/two.loss")
if [ "$n1" != "$SHORT_STEPS" ] || [ "$n2" != "$SHORT_STEPS" ]; then
  fail "expected $SHORT_STEPS loss lines, got $n1 (1 host) and $n2 (2 hosts)"
else
  maxrel=$(paste "$TMP/one.loss" "$TMP/two.loss" | awk '
    { d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; r = d / (m > 1e-12 ? m : 1e-12);
      if (r > worst) worst = r; if ($1 != $3) bad = 1 }
    END { if (bad) print "misaligned"; else printf "%.3g", worst }')
  echo "FIGURE loss_max_relative_difference_1host_vs_2host $maxrel"
  echo "first/last loss 1 host: $(head -1 "$TMP/one.loss") / $(tail -1 "$TMP/one.loss")"
  echo "first/last loss 2 hosts: $(head -1 "$TMP/two.loss") / $(tail -1 "$TMP/two.loss")"
  if [ "$maxrel" = misaligned ] || awk -v m="$maxrel" -v t="$LOSS_TOLERANCE" 'BEGIN { exit !(m > t) }'; then
    paste "$TMP/one.loss" "$TMP/two.loss"
    fail "losses differ between 1 and 2 hosts (max relative difference $maxrel)"
  fi
fi

# ---------------------------------------------------------------- 2. cut the link mid-run
start_machine 0 "$TMP/long0.log" --steps 1000000 --step_sleep_ms 100
P0=${PIDS[-1]}
start_machine 1 "$TMP/long1.log" --steps 1000000 --step_sleep_ms 100
P1=${PIDS[-1]}
DEADLINE=$(awk -v n="$(now)" -v l="$START_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')
until [ "$(losses "$TMP/long0.log" | wc -l)" -ge 5 ]; do
  if ! kill -0 "$P0" 2>/dev/null || ! kill -0 "$P1" 2>/dev/null ||
     awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { exit !(n > d) }'; then
    echo "--- machine 0"; cat "$TMP/long0.log"; echo "--- machine 1"; cat "$TMP/long1.log"
    fail "the long 2-host run did not get going"
    exit 1
  fi
  sleep 0.2
done
T_CUT=$(now)
ip -n "$NS0" link set "$VETH0" down
echo "cut the link ($VETH0 down) after $(losses "$TMP/long0.log" | wc -l) steps"
CUT_DEADLINE=$(awk -v n="$T_CUT" -v l="$CUT_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')
rc0=""; rc1=""; t0=""; t1=""
while [ -z "$rc0" ] || [ -z "$rc1" ]; do
  if [ -z "$rc0" ] && ! kill -0 "$P0" 2>/dev/null; then wait "$P0"; rc0=$?; t0=$(elapsed "$T_CUT"); fi
  if [ -z "$rc1" ] && ! kill -0 "$P1" 2>/dev/null; then wait "$P1"; rc1=$?; t1=$(elapsed "$T_CUT"); fi
  if awk -v d="$CUT_DEADLINE" -v n="$(now)" 'BEGIN { exit !(n > d) }'; then break; fi
  sleep 0.2
done
echo "FIGURE link_cut_exit_s_machine0 ${t0:-none}"
echo "FIGURE link_cut_exit_s_machine1 ${t1:-none}"
echo "--- machine 0 (tail)"; tail -n 6 "$TMP/long0.log"
echo "--- machine 1 (tail)"; tail -n 6 "$TMP/long1.log"
[ -n "$rc0" ] || fail "machine 0 still running ${CUT_LIMIT_S} s after the cut"
[ -n "$rc1" ] || fail "machine 1 still running ${CUT_LIMIT_S} s after the cut"
[ -z "$rc0" ] || [ "$rc0" != 0 ] || fail "machine 0 exited 0 after losing its peer"
[ -z "$rc1" ] || [ "$rc1" != 0 ] || fail "machine 1 exited 0 after losing its peer"
grep -qF "rank 1 at $A1" "$TMP/long0.log" || fail "machine 0's output does not name rank 1 at $A1"
grep -qF "rank 0 at $A0" "$TMP/long1.log" || fail "machine 1's output does not name rank 0 at $A0"

# ---------------------------------------------------------------- 3. advertised loopback
ip -n "$NS0" link set "$VETH0" up  # the link is back: only the advertised address is wrong
INIT_TIMEOUT_MS=10000
EXTRA_ENV=(ACCEL_GLOO_HOSTNAME=127.0.0.1)
T3=$(now)
start_machine 0 "$TMP/lo0.log" --steps 3 --timeout_ms "$INIT_TIMEOUT_MS"
P0=${PIDS[-1]}
start_machine 1 "$TMP/lo1.log" --steps 3 --timeout_ms "$INIT_TIMEOUT_MS"
P1=${PIDS[-1]}
EXTRA_ENV=()
DEADLINE=$(awk -v n="$(now)" -v l="$(( INIT_TIMEOUT_MS / 1000 + 30 ))" 'BEGIN { printf "%.3f", n + l }')
wait_exit "$P0" "$DEADLINE"
rc0=$RC
t0=$(elapsed "$T3")
wait_exit "$P1" "$DEADLINE"
rc1=$RC
t1=$(elapsed "$T3")
echo "FIGURE loopback_advertised_exit_s_machine0 $t0 (rc $rc0)"
echo "FIGURE loopback_advertised_exit_s_machine1 $t1 (rc $rc1)"
grep -h "\[init\]" "$TMP/lo0.log" "$TMP/lo1.log"
for m in 0 1; do
  rc=$rc0; peer=1; [ "$m" = 1 ] && { rc=$rc1; peer=0; }
  if [ "$rc" = timeout ] || [ "$rc" = 0 ]; then
    cat "$TMP/lo$m.log"
    fail "machine $m did not fail within the init timeout + 30 s (rc $rc)"
  fi
  if ! grep -qF "rank $peer at 127.0.0.1:" "$TMP/lo$m.log"; then
    cat "$TMP/lo$m.log"
    fail "machine $m's output does not name rank $peer and the address it advertised"
  fi
done

# ---------------------------------------------------------------- 4. a lossy link
LOSS=30
LOSSY_LIMIT_S=150  # from the loss on until both sides must have exited (46 s more after the first)
# loss_on <ns> <dev>: drops LOSS % of what leaves <dev>; 0 when done, 1 when impossible here.
LOSS_HOW=""
loss_on() {
  if ip netns exec "$1" tc qdisc add dev "$2" root netem loss "$LOSS%" 2>/dev/null; then
    LOSS_HOW="tc netem"
    return 0
  fi
  for ipt in iptables-legacy iptables; do
    command -v "$ipt" >/dev/null 2>&1 || continue
    if ip netns exec "$1" "$ipt" -A OUTPUT -o "$2" -m statistic --mode random \
        --probability "0.$LOSS" -j DROP 2>/dev/null; then
      LOSS_HOW="$ipt statistic"
      return 0
    fi
  done
  return 1
}
# Heartbeat (and watchdog) timeout 6 s: 6 beats lost in a row is rare at 30 % loss, a TCP stall
# of 6 s (5 retransmission timeouts in a row) is not. --hidden 8192: 172k parameters, so the
# gradients travel through Gloo's ring, not the control channel.
EXTRA_ENV=(ACCEL_HEARTBEAT_TIMEOUT=6)
start_machine 0 "$TMP/lossy0.log" --steps 1000000 --step_sleep_ms 100 --hidden 8192 --timeout_ms 30000
P0=${PIDS[-1]}
start_machine 1 "$TMP/lossy1.log" --steps 1000000 --step_sleep_ms 100 --hidden 8192 --timeout_ms 30000
P1=${PIDS[-1]}
EXTRA_ENV=()
DEADLINE=$(awk -v n="$(now)" -v l="$START_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')
started=1
until [ "$(losses "$TMP/lossy0.log" | wc -l)" -ge 3 ]; do
  if ! kill -0 "$P0" 2>/dev/null || ! kill -0 "$P1" 2>/dev/null ||
     awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { exit !(n > d) }'; then
    echo "--- machine 0"; cat "$TMP/lossy0.log"; echo "--- machine 1"; cat "$TMP/lossy1.log"
    fail "the lossy-link run did not get going"
    started=0
    break
  fi
  sleep 0.2
done
if [ "$started" = 1 ] && loss_on "$NS0" "$VETH0" && loss_on "$NS1" "$VETH1"; then
  T_LOSS=$(now)
  echo "$LOSS % loss on both ends ($LOSS_HOW) after $(losses "$TMP/lossy0.log" | wc -l) steps"
  LOSS_DEADLINE=$(awk -v n="$T_LOSS" -v l="$LOSSY_LIMIT_S" 'BEGIN { printf "%.3f", n + l }')
  rc0=""; rc1=""; t0=""; t1=""
  # The longest time without a new step: a link that crawls (TCP retransmits, steps still coming)
  # is not an error; one that stalls must be named before the collective timeout (30 s).
  last_steps=0; last_t=$(now); max_gap=0; extended=""
  gap_from() { awk -v a="$1" -v b="$(now)" -v m="$2" 'BEGIN { g = b - a; printf "%.1f", (g > m ? g : m) }'; }
  while [ -z "$rc0" ] || [ -z "$rc1" ]; do
    if [ -z "$rc0" ] && ! kill -0 "$P0" 2>/dev/null; then wait "$P0"; rc0=$?; t0=$(elapsed "$T_LOSS"); fi
    if [ -z "$rc1" ] && ! kill -0 "$P1" 2>/dev/null; then wait "$P1"; rc1=$?; t1=$(elapsed "$T_LOSS"); fi
    # Once one side is out, the other may be inside a Gloo receive that no abort wakes (README,
    # "Limits"): it raises at its collective timeout (30 s), a heartbeat timeout (6 s) at most
    # after the first left; give it that and a margin.
    if [ -n "$rc0$rc1" ] && [ -z "$extended" ]; then
      extended=1
      LOSS_DEADLINE=$(awk -v d="$LOSS_DEADLINE" -v n="$(now)" 'BEGIN { e = n + 46; printf "%.3f", (e > d ? e : d) }')
    fi
    n=$(losses "$TMP/lossy0.log" | wc -l)
    if [ "$n" -gt "$last_steps" ]; then
      max_gap=$(gap_from "$last_t" "$max_gap"); last_steps=$n; last_t=$(now)
    fi
    if awk -v d="$LOSS_DEADLINE" -v n="$(now)" 'BEGIN { exit !(n > d) }'; then break; fi
    sleep 0.2
  done
  crawled=0
  if [ -z "$rc0" ] && [ -z "$rc1" ]; then
    max_gap=$(gap_from "$last_t" "$max_gap")
    echo "FIGURE lossy_link_longest_step_gap_s $max_gap"
    if awk -v g="$max_gap" 'BEGIN { exit !(g < 30) }'; then
      echo "the link crawled: steps kept coming (longest gap ${max_gap} s), no error needed"
      crawled=1
    fi
    kill -KILL -- "-$P0" "-$P1" 2>/dev/null
  fi
  echo "FIGURE lossy_link_exit_s_machine0 ${t0:-none}"
  echo "FIGURE lossy_link_exit_s_machine1 ${t1:-none}"
  echo "FIGURE lossy_link_steps_done $(losses "$TMP/lossy0.log" | wc -l)"
  echo "--- machine 0 (tail)"; tail -n 4 "$TMP/lossy0.log"
  echo "--- machine 1 (tail)"; tail -n 4 "$TMP/lossy1.log"
  if [ "$crawled" = 0 ]; then
    [ -n "$rc0" ] || fail "machine 0 still running ${LOSSY_LIMIT_S} s after the link began losing $LOSS %, steps stalled ${max_gap} s"
    [ -n "$rc1" ] || fail "machine 1 still running ${LOSSY_LIMIT_S} s after the link began losing $LOSS %, steps stalled ${max_gap} s"
    [ -z "$rc0" ] || [ "$rc0" != 0 ] || fail "machine 0 exited 0 on a lossy link"
    [ -z "$rc1" ] || [ "$rc1" != 0 ] || fail "machine 1 exited 0 on a lossy link"
    # The peer is named with its address, by the watchdog or the heartbeat (a stall, or on a link
    # that crawls rather than stalls, its loss line), on some side.
    if ! grep -qE "(no progress on the (Gloo|control) connection to rank 1 at $A1|rank 1 at $A1 sent no heartbeat|heartbeats from rank 1 at $A1 were lost)" "$TMP/lossy0.log" &&
       ! grep -qE "(no progress on the (Gloo|control) connection to rank 0 at $A0|rank 0 at $A0 sent no heartbeat|heartbeats from rank 0 at $A0 were lost)" "$TMP/lossy1.log"; then
      fail "neither side names the unreachable peer and its address"
    fi
    grep -hoE "no progress on the (Gloo|control) connection to rank [01]|sent no heartbeat|heartbeats from rank [01] at [0-9.]* were lost" \
      "$TMP/lossy0.log" "$TMP/lossy1.log" | sort | uniq -c | sed 's/^/detected by: /'
  fi
else
  [ "$started" = 1 ] && echo "SKIP part 4: neither tc netem nor an iptables statistic rule works here"
  kill -KILL -- "-$P0" "-$P1" 2>/dev/null
fi

echo "FIGURE multihost_test_s $(elapsed "$T_START")"
[ "$FAILED" = 0 ] && echo "PASS" || exit 1
