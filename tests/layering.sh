#!/usr/bin/env bash
# The layering of DESIGN.md, checked on the sources: cmd -> server -> api ->
# engine -> kvcache, each module seen only through its public headers.
#   cmd/     (the program: main.c and its commands) may include its own
#            headers, server.h, api.h and the engine facade (engine/include/)
#   server/  may include its own headers, api.h and the engine facade
#   api/     may include its own headers and the engine facade
#   engine/  may include its own headers (engine/, cpu/, cuda/, include/) and
#            kvcache.h; never api/ or server/
#   kvcache/ may include only its own headers
# and each public header compiles alone (self-contained) with only the public
# directories of the modules below it. Usage: tests/layering.sh [CC]
set -euo pipefail
cd "$(dirname "$0")/.."
CC="${1:-cc}"
fail=0

own_headers() { # basenames of the headers under a folder
  find "$@" -name '*.h' -o -name '*.cuh' | xargs -n1 basename | sort -u
}

check() { # folder, allowed extra headers...
  local dir=$1; shift
  local allowed
  allowed="$(own_headers "$dir"; printf '%s\n' "$@")"
  while IFS=: read -r file line inc; do
    name=$(basename "$inc")
    if ! grep -qxF "$name" <<<"$allowed"; then
      echo "layering: $file:$line includes \"$inc\", which $dir/ may not see" >&2
      fail=1
    fi
  done < <(grep -rnoE '^#include "[^"]+"' "$dir" --include='*.c' --include='*.h' \
             --include='*.cu' --include='*.cuh' | sed -E 's/#include "([^"]+)"/\1/')
}

facade=$(own_headers engine/include) # engine.h, decoder.h

check cmd server.h api.h $facade
check server api.h $facade
check api $facade
check engine kvcache.h
check kvcache

# public headers alone, each with only the public include paths below it
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
selfcontained() { # header, -I flags...
  local h=$1; shift
  printf '#include "%s"\n' "$(basename "$h")" > "$tmp/t.c"
  if ! "$CC" -std=c11 -Wall -Werror -fsyntax-only -I"$(dirname "$h")" "$@" "$tmp/t.c" \
       2> "$tmp/err"; then
    echo "layering: $h does not compile on its own:" >&2
    cat "$tmp/err" >&2
    fail=1
  fi
}
selfcontained kvcache/kvcache.h
for h in engine/include/*.h; do
  selfcontained "$h"
done
selfcontained api/api.h -Iengine/include
selfcontained server/server.h
selfcontained cmd/cmd.h -Iengine/include

[ "$fail" = 0 ] && echo "layering: ok"
exit "$fail"
