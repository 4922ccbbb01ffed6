#!/usr/bin/env bash
# Run the test suite (or the tests named after N) N times in a row, stopping at the first
# failure; print one line per run and the count of consecutive passes. The check that a flaky
# test is fixed: a retry would hide it, a count of consecutive passes does not.
#
#   bench/repeat_tests.sh 20                          # the full suite, 20 times
#   bench/repeat_tests.sh 20 tests/test_distributed.py::test_two_gloo_processes_make_the_single_process_update
#
# Each run's output is kept in ${REPEAT_DIR:-runs/repeat-tests}/run-K.txt.
set -u
n=${1:?usage: bench/repeat_tests.sh N [pytest args...]}
shift
dir=${REPEAT_DIR:-runs/repeat-tests}
mkdir -p "$dir"
passed=0
for k in $(seq 1 "$n"); do
    start=$(date +%s)
    HF_HUB_OFFLINE=1 python -m pytest -q -p no:cacheprovider "$@" > "$dir/run-$k.txt" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    echo "run $k: rc $rc, ${took} s, $(date -u +%H:%M) UTC: $(tail -n 1 "$dir/run-$k.txt")"
    if [ "$rc" -ne 0 ]; then
        echo "stopped at run $k after $passed consecutive passes; see $dir/run-$k.txt"
        exit 1
    fi
    passed=$k
done
echo "$passed consecutive passes"
