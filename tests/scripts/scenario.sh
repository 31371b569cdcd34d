#!/bin/bash
# A shell user's session on a memosfs mount, with mkdir, cp, cat, echo, ls, rm.
# Usage: scenario.sh MOUNTPOINT WORKDIR — exits non-zero at the first surprise.
set -eu
M=$1
W=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir "$M/planner"
mkdir "$M/planner/chat-42"
echo "system prompt kv" > "$W/prefix"
cp "$W/prefix" "$M/planner/chat-42/prefix-0"
cp "$W/prefix" "$M/planner/chat-42/turn-1"
[ "$(cat "$M/planner/chat-42/prefix-0")" = "system prompt kv" ] || fail "read back"
[ "$(ls "$M/planner/chat-42" | tr '\n' ' ')" = "prefix-0 turn-1 " ] || fail "ls: $(ls "$M/planner/chat-42")"

# tune the cache
[ "$(cat "$M/.memos/cache/evict_batch")" = 16 ] || fail "default evict_batch"
echo 24 > "$M/.memos/cache/evict_batch"
[ "$(cat "$M/.memos/cache/evict_batch")" = 24 ] || fail "evict_batch not set"
if echo banana > "$M/.memos/cache/evict_batch" 2>/dev/null; then fail "banana accepted"; fi
[ "$(cat "$M/.memos/cache/evict_batch")" = 24 ] || fail "banana changed the knob"

# the stats speak
cat "$M/.memos/cache/stats" > "$W/stats"
grep -q '^slots 2$' "$W/stats" || fail "slots: $(cat "$W/stats")"

# overwrite, then drop the session's context
echo "turn two" > "$M/planner/chat-42/turn-1"
[ "$(cat "$M/planner/chat-42/turn-1")" = "turn two" ] || fail "overwrite"
echo planner/chat-42 > "$M/.memos/cache/reset_context"
[ -z "$(ls "$M/planner/chat-42")" ] || fail "reset_context left slots"

# clean up like a user
cp "$W/prefix" "$M/planner/chat-42/again"
rm "$M/planner/chat-42/again"
rm -r "$M/planner"
[ -z "$(ls "$M")" ] || fail "root not empty: $(ls "$M")"
echo 1 > "$M/.memos/cache/flush"
echo "scenario ok"
