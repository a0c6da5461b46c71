#!/bin/sh
# Runs a test that needs root (setting the system clock, sending on the kernel's uevent group):
# without root it is a skip (exit 77, ctest's SKIP_RETURN_CODE), never a pass.
#   needs_root.sh WHY -- COMMAND [ARGS...]
why=$1
shift 2
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: needs root: $why"
  exit 77
fi
exec "$@"
