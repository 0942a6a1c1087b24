#!/usr/bin/env bash
# The README's test command (.ci/run: bootstrap, then the whole suite on two xdist workers) RUNS times
# in a row while LOAD other processes keep the CPUs busy, as on a shared CI machine; a suite that
# passes only on an idle machine fails here. docs/testing.md says when to run it.
#   bash scripts/stress_suite.sh                 # 3 runs beside 2 busy processes
#   RUNS=1 LOAD=4 bash scripts/stress_suite.sh
# Each run's summary line and minutes go to stdout and to LOG (default stress-suite.log), its whole
# output to stress-suite-<n>.out; the exit status is 1 if any run failed. The busy processes are
# plain Python loops (Debian's stress-ng --cpu N does the same), ended whatever ends this script.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
RUNS=${RUNS:-3}
LOAD=${LOAD:-2}
LOG=${LOG:-stress-suite.log}
case "$RUNS$LOAD" in ''|*[!0-9]*) echo "stress_suite.sh: RUNS and LOAD must be whole numbers" >&2; exit 2;; esac
busy=()
# shellcheck disable=SC2329  # called through the trap below
stop_load() { [ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null; wait 2>/dev/null; }
trap stop_load EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$LOAD"); do
  python3 -c 'while True: pass' &
  busy+=($!)
done
echo "$(date -u +%FT%TZ) $RUNS run(s) of .ci/run beside $LOAD busy process(es), $(nproc) CPUs" | tee -a "$LOG"
failed=0
for n in $(seq "$RUNS"); do
  start=$(date +%s)
  # -vv: each test's name and outcome as it ends, so a run cut short still says what failed
  PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -vv" bash .ci/run > "stress-suite-$n.out" 2>&1
  status=$?
  minutes=$(( ($(date +%s) - start + 30) / 60 ))
  summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "stress-suite-$n.out" | tail -1)
  echo "run $n: exit $status, ${minutes} min: ${summary:-no pytest summary (see stress-suite-$n.out)}" | tee -a "$LOG"
  [ "$status" = 0 ] || failed=1
done
exit "$failed"
