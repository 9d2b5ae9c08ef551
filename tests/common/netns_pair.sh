# Sourced by the two-host tests (multihost_test.sh, multihost_hsdp_test.sh): two "hosts" as two
# network namespaces joined by a veth pair, and the helpers both tests use around them.
#
#   . "$(dirname "$0")/../common/netns_pair.sh"
#   netns_pair <tag> <subnet prefix>    # e.g. netns_pair mh 10.251
#
# netns_pair exits 77 (skipped) without root or `ip netns`; otherwise it creates namespaces
# accel-<tag>0-$$ / accel-<tag>1-$$ (NS0, NS1) joined by veth a<tag>0-$$ / a<tag>1-$$ (VETH0,
# VETH1) with addresses <prefix>.X.1 / .2 (A0, A1; X a /24 not in use on this host), a temporary
# folder TMP, and a trap that removes all of it, and kills every process in the namespaces and
# every process group listed in PIDS, on every exit path. FAILED, T_START are set too.

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; FAILED=1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

netns_pair_cleanup() {
  # Everything still running inside the namespaces (workers, whatever accel-run started), then
  # the accel-run process groups the test started.
  for ns in "$NS0" "$NS1"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for p in "${PIDS[@]}"; do
    # accel-run and, through `ip netns exec`, its workers: the whole process group of each.
    kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
  done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  ip netns del "$NS0" 2>/dev/null
  ip netns del "$NS1" 2>/dev/null
  rm -rf "$TMP"
}

netns_pair() {
  local tag=$1 prefix=$2
  [ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
  command -v ip >/dev/null 2>&1 || skip "the ip command (iproute2) is missing"
  ID=$$
  NS0=accel-${tag}0-$ID
  NS1=accel-${tag}1-$ID
  VETH0=a${tag}0-$ID   # interface names are at most 15 characters
  VETH1=a${tag}1-$ID
  TMP=$(mktemp -d "/tmp/accel-netns-${tag}-XXXXXX")
  PIDS=()
  FAILED=0
  T_START=$(now)
  trap netns_pair_cleanup EXIT
  trap 'echo "interrupted"; exit 1' INT TERM HUP

  if ! ip netns add "$NS0" 2>"$TMP/err"; then
    skip "ip netns is not permitted here: $(cat "$TMP/err")"
  fi
  ip netns add "$NS1" || { echo "FAIL: ip netns add $NS1"; exit 1; }

  # <prefix>.X.0/24 with X not in use on this host (the namespaces are isolated, but a collision
  # would make logs and routes confusing when someone debugs this).
  local pat=${prefix//./\\.} i c X=""
  for i in $(seq 0 253); do
    c=$(( (ID + i) % 254 + 1 ))
    if ! ip -4 addr show | grep -q "$pat\.$c\." && ! ip -4 route show | grep -q "$pat\.$c\."; then
      X=$c
      break
    fi
  done
  [ -n "$X" ] || { echo "FAIL: no free $prefix.X.0/24"; exit 1; }
  A0=$prefix.$X.1
  A1=$prefix.$X.2

  set -e
  ip link add "$VETH0" netns "$NS0" type veth peer name "$VETH1" netns "$NS1"
  ip -n "$NS0" addr add "$A0/24" dev "$VETH0"
  ip -n "$NS1" addr add "$A1/24" dev "$VETH1"
  for ns in "$NS0" "$NS1"; do ip -n "$ns" link set lo up; done  # a new namespace's lo is down
  ip -n "$NS0" link set "$VETH0" up
  ip -n "$NS1" link set "$VETH1" up
  set +e
  echo "namespaces $NS0 ($A0) and $NS1 ($A1), veth $VETH0/$VETH1"
}

# wait_exit <pid> <deadline (epoch s)>: sets RC to the exit code, or "timeout". (Not run in a
# command substitution: a subshell cannot wait for this shell's children.)
wait_exit() {
  local pid=$1 deadline=$2
  while kill -0 "$pid" 2>/dev/null; do
    if awk -v d="$deadline" -v n="$(now)" 'BEGIN { exit !(n > d) }'; then RC=timeout; return; fi
    sleep 0.2
  done
  wait "$pid"
  RC=$?
}
