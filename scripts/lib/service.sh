# Sourced by the service scripts (kafka, s3, registry, redis, postgres): what each needs to run
# a server in its own state folder and to stop only that one. Each script sets $state (its
# folder, holding `pid`) and $cache before sourcing this.

# The server whose pid `$state/pid` holds is alive, runs in $state, and its command line holds
# `$1` (its config file's path, or the program's name where the server rewrites its command
# line): a pid file copied from another folder, or a pid reused by another process, is no match.
runs_here() {
  local pid
  [ -f "$state/pid" ] || return 1
  pid=$(cat "$state/pid")
  kill -0 "$pid" 2>/dev/null && [ "/proc/$pid/cwd" -ef "$state" ] &&
    grep -qaF "$1" "/proc/$pid/cmdline" 2>/dev/null
}

# The child just launched still runs (neither exited nor a zombie awaiting its reaping). Only
# while waiting for it to answer: just after the fork its folder and command line are still
# the script's, so `runs_here` would not know it yet.
launched() {
  local pid
  pid=$(cat "$state/pid" 2>/dev/null) || return 1
  grep -qE '^State:[[:space:]]+[^Z]' "/proc/$pid/status" 2>/dev/null
}

# Two test runs at once (two clones on one machine) share the cache and Maven's repository:
# one Maven install at a time; the second finds the first one's in place. Calls `installed`
# and `fetch`, the script's own.
maven_install() {
  if installed; then return; fi
  mkdir -p "$cache/tools"
  exec 9>>"$cache/tools/maven.lock"
  flock 9
  installed || fetch
  # Closed before the server starts, which would otherwise hold the lock for its lifetime.
  exec 9>&-
}

# Two test runs at once (scripts/tests/services-twice.sh does this on purpose) may both find a
# Debian package missing: one apt-get at a time, under a lock of ours, waiting (not failing) on
# apt's own; the second finds the package in place. Calls `present`, the script's own check.
#   apt_install_once PACKAGE... (apt-get install's options may come first)
apt_install_once() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  (
    flock 8
    present && exit 0
    $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
  ) 8>>"${TMPDIR:-/tmp}/riffle-apt.lock"
}

