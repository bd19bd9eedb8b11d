# Sourced by test.sh, wheels.sh and .ci/run: `stage TEXT` prints "== [Ns] TEXT" to stderr, N the
# seconds since the outermost of them started (TREEPACK_T0, inherited), and notes the stage in
# TREEPACK_STAGES (a file, inherited). The script that started the clock prints, when it exits,
# how long each stage took and the total. Each stage line also says how much disk is free.
if [ -z "${TREEPACK_T0:-}" ]; then
  export TREEPACK_T0=$(date +%s) TREEPACK_STAGES=$(mktemp)
  trap 'stage_summary $?' EXIT
  # The least disk free during the run, sampled every 5 s (the stage lines only see their starts):
  # "KiB<TAB>seconds" in a file the summary prints.
  TREEPACK_DISK_LOW=$(mktemp)
  (
    low=""
    while sleep 5; do
      f=$(df -Pk . 2>/dev/null | awk 'NR == 2 { print $4 }') || continue
      if [ -n "$f" ] && { [ -z "$low" ] || [ "$f" -lt "$low" ]; }; then
        low=$f
        printf '%s\t%s\n' "$f" $(($(date +%s) - TREEPACK_T0)) >"$TREEPACK_DISK_LOW"
      fi
    done
  ) </dev/null >/dev/null 2>&1 &
  TREEPACK_DISK_PID=$!
fi
stage() {
  local t=$(($(date +%s) - TREEPACK_T0)) free
  # Free disk beside each stage: CI machines differ in disk, and a full one fails far from its cause.
  free=$(df -Pk . 2>/dev/null | awk 'NR == 2 { printf "%.1f GiB free", $4 / 1048576 }')
  echo "== [${t}s] $* (${free:-disk unknown})" >&2
  printf '%s\t%s\n' "$t" "${*:0:100}" >>"$TREEPACK_STAGES"
}
stage_summary() {
  local end=$(($(date +%s) - TREEPACK_T0)) outcome=ok
  [ "$1" = 0 ] || outcome="failed, exit status $1"
  {
    echo "== stage times (seconds; the last stage running when it stopped):"
    awk -F'\t' -v end="$end" '{ t[NR] = $1; s[NR] = $2 }
      END { for (i = 1; i <= NR; i++) printf "%6d  %s\n", (i < NR ? t[i + 1] : end) - t[i], s[i] }' "$TREEPACK_STAGES"
    echo "== [${end}s] total ($outcome)"
    awk -F'\t' 'NF == 2 { printf "== the least disk free: %.1f GiB, at %ds\n", $1 / 1048576, $2 }' "$TREEPACK_DISK_LOW"
  } >&2
  kill "$TREEPACK_DISK_PID" 2>/dev/null || true
  rm -f "$TREEPACK_STAGES" "$TREEPACK_DISK_LOW"
}
# `stop_with_script PID`: when the calling script exits (a stage failed, or it ended), the
# background job PID and its children are stopped too, so that they do not go on writing under
# the next run; the clock's summary still prints when that script started the clock.
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
stop_with_script() {
  if [ -z "${stop_pids+set}" ]; then
    stop_own_clock=$(trap -p EXIT)
    trap stop_on_exit EXIT
  fi
  stop_pids="${stop_pids:-} $1"
}
stop_on_exit() {
  local rc=$? p
  for p in $stop_pids; do kill -0 "$p" 2>/dev/null && kill_tree "$p"; done
  if [ -n "$stop_own_clock" ]; then stage_summary "$rc"; fi
}
