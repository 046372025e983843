# Shared by scripts/setup and scripts/test (sourced, not run).

say() { echo "setup: $*" >&2; }

# Runs cargo with its output in a log; shows progress, and on failure the
# first error and what to do about it instead of thousands of lines of
# build-script output. Used by scripts/test too.
cargo_logged() { # log-file, cargo args...
  local log="$1"; shift
  mkdir -p "$(dirname "$log")"
  local start=$SECONDS
  cargo "$@" --color never >"$log" 2>&1 &
  local pid=$! last="" shown=$SECONDS now
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    [ $((SECONDS - shown)) -ge 20 ] || continue
    now=$(grep -E '^ +(Compiling|Checking) ' "$log" | tail -n1 | sed -E 's/^ +//' || true)
    if [ -n "$now" ] && [ "$now" != "$last" ]; then
      say "  ... $((SECONDS - start)) s: $now"
      last="$now" shown=$SECONDS
    fi
  done
  if wait "$pid"; then
    say "  done in $((SECONDS - start)) s (log: $log)"
    return 0
  fi
  say "the build failed after $((SECONDS - start)) s; the first error (full log: $log):"
  # The first error, without the build scripts' `cargo:` directives (a
  # failing llama.cpp build prints thousands of them before its panic).
  awk '/^error(\[E[0-9]+\])?:/ {p=1} p && !/^ *cargo:/ {print; n++} n>=30 {exit}' "$log" >&2
  if grep -q 'Unable to find libclang' "$log"; then
    say "fix: install libclang-dev (apt-get install libclang-dev) or set LIBCLANG_PATH to the folder holding libclang.so"
  elif grep -q -i 'cmake' "$log" && grep -q -i 'not found' "$log"; then
    say "fix: install cmake and a C++ compiler (apt-get install cmake g++)"
  elif grep -q -i 'No space left on device' "$log"; then
    say "fix: free disk space (the build needs several GB under target/)"
  else
    say "fix: see the error above; scripts/setup checks what is installed"
  fi
  return 1
}

