#!/bin/sh
# Container entrypoint: find the model (or fetch and check the default one), then exec
# `streamsink serve` so that the server itself receives tini's SIGTERM and
# drains. Arguments are appended to the server's, so they override the
# defaults here (the last flag wins): docker run streamsink:cpu --max-seqs 16
set -eu
: "${STREAMSINK_PORT:=8080}"
: "${STREAMSINK_DRAIN_TIMEOUT:=60}"
: "${XDG_CACHE_HOME:=/models}"
export XDG_CACHE_HOME
default="$XDG_CACHE_HOME/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf"
model="${STREAMSINK_MODEL:-$default}"
if [ "$model" = "$default" ] && [ "${STREAMSINK_FETCH_MODEL:-1}" = 1 ]; then
  # On every start, not only when the file is missing: fetch-model.sh keeps a
  # file whose sha256 is right and fetches any other again (one that a kill or
  # a full disk left short), so a damaged model never reaches the server.
  echo "streamsink-entrypoint: checking the default model in $XDG_CACHE_HOME/streamsink" \
       "(fetching it if it is missing or damaged)" >&2
  model=$(/opt/streamsink/fetch-model.sh) || {
    echo "streamsink-entrypoint: could not fetch the default model into" \
         "$XDG_CACHE_HOME/streamsink" >&2
    exit 3
  }
elif [ ! -f "$model" ]; then
  echo "streamsink-entrypoint: no model at $model: mount one there, or leave" \
       "STREAMSINK_MODEL unset to fetch the default SmolLM2 into $XDG_CACHE_HOME" >&2
  exit 3
fi
exec /usr/local/bin/streamsink serve --host 0.0.0.0 --port "$STREAMSINK_PORT" \
  --drain-timeout "$STREAMSINK_DRAIN_TIMEOUT" --backend "${STREAMSINK_BACKEND:-cpu}" \
  -m "$model" "$@"
