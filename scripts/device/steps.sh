# Sourced by the GPU machine's check scripts (gpu_checks.sh, training_checks.sh): `run NAME LIMIT
# COMMAND...` runs one step under its own timeout, cut to what is left of the script's budget
# ($budget seconds, counted by bash's SECONDS), with its output in $out/NAME.log, the last lines
# echoed and one line per step collected in the array `summary`; a step that would get less than
# 20 s is skipped and listed as rc=skip.
summary=()
run() {  # name, timeout in seconds, command...
  local name=$1 limit=$2
  shift 2
  # 10 s stay in reserve for the kill after a timeout (timeout -k) and the final printing.
  local left=$((budget - SECONDS - 10))
  if ((left < 20)); then
    echo "skipped: ${left}s of the ${budget}s budget left" > "$out/$name.log"
    summary+=("$(printf '%-40s rc=%-4s %4ss' "$name" skip 0)")
    return
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-40s rc=%-4s %4ss (limit %ss)' "$name" "$rc" $((SECONDS - t0)) "$limit")")
  tail -n 5 "$out/$name.log"
}
