#!/usr/bin/env bash
# A GPU job longer than one device call. The device tool's calls last at most 10 minutes and
# the machine stays warm about 30 s after each, so the job runs detached (setsid: it outlives
# the call) from a copy of the repository, and each call waits on it, then returns its files.
#
#   bash scripts/gpu_detach.sh start CMD...   copy the repo to $JOB/src, start CMD there, wait
#   bash scripts/gpu_detach.sh wait           a later call on the warm machine: wait again
#
# CMD runs with JOB_OUT=$JOB/out (its files go there) and its output in $JOB/console.txt.
# Each call waits until CMD ends or WAIT seconds (default 560) pass, then puts into $OUT:
# state.txt ("running" or "exit N" and the time), console.txt, and job.tar.gz (all of
# $JOB_OUT): 3 files, so the device tool's 8-file limit never drops any.
set -uo pipefail
JOB=${JOB:-/tmp/gpu_job}
WAIT=${WAIT:-560}
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"

case "${1:-}" in
start)
    shift
    rm -rf "$JOB"
    mkdir -p "$JOB/out"
    # The working tree is copied again by each device call: the job must not build in it.
    tar --exclude=./build --exclude=./.git -cf - . | (mkdir -p "$JOB/src" && cd "$JOB/src" && tar -xf -)
    (
        cd "$JOB/src" || exit 1
        JOB_OUT="$JOB/out" setsid bash -c '"$@" > "$0/console.txt" 2>&1; echo $? > "$0/rc"' \
            "$JOB" "$@" < /dev/null &
    )
    ;;
wait)
    # A fresh machine (the last one went back) has no job: say so at once, not after WAIT.
    [ -d "$JOB" ] || { echo "no job at $JOB (a fresh machine?)" | tee "$OUT/state.txt"; exit 3; } ;;
*) echo "usage: $0 start CMD... | wait" >&2; exit 2 ;;
esac

end=$((SECONDS + WAIT))
while [ ! -f "$JOB/rc" ] && [ "$SECONDS" -lt "$end" ]; do
    sleep 5
done
if [ -f "$JOB/rc" ]; then
    echo "exit $(cat "$JOB/rc") $(date -Is)" > "$OUT/state.txt"
else
    echo "running $(date -Is)" > "$OUT/state.txt"
fi
cp "$JOB/console.txt" "$OUT/console.txt" 2>/dev/null
tar -czf "$OUT/job.tar.gz" -C "$JOB" out
cat "$OUT/state.txt"
tail -n 40 "$OUT/console.txt" 2>/dev/null
