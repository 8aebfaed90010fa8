#!/bin/sh
# settings_wrapper.sh VAR VALUE0 VALUE COMMAND...: runs COMMAND with VAR=VALUE0 on rank 0
# and VAR=VALUE on the other ranks (TUTTI_RANK, which tuttirun sets), so that a tuttirun
# job can give its ranks different settings (test/integration/settings_driver.c).
var=$1 first=$2 others=$3
shift 3
if [ "${TUTTI_RANK:?settings_wrapper.sh runs under tuttirun}" = 0 ]; then
  export "$var=$first"
else
  export "$var=$others"
fi
exec "$@"
