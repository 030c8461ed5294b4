#!/usr/bin/env bash
# The trace viewer in a real browser: trace a small store, serve it on a free loopback port, load
# the page in headless chromium with a scripted click (#click=F dispatches a click event on the
# overview), and check the DOM it leaves: the overview drew (ink pixels), the click was answered
# (reads and readers listed), no page error, and chromium logged no console message at all.
# Usage: stream_viewer_browser.sh FLASHLAB [SCREENSHOT.png]
# Exit 0 pass, 1 fail, 77 skipped (no chromium; CTest reports it as skipped).
set -euo pipefail
flashlab=$1
shot=${2:-}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "skipped: chromium is not installed (apt-get install chromium)"
  exit 77
fi
work=$(mktemp -d)
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- DOM (first lines) ---"; head -c 3000 "$work/dom.html" 2>/dev/null || true; echo; exit 1; }

"$flashlab" stream trace --store "$work/store" --seq 2048 --dim 32 --block-m 64 --block-n 64 --k 8 --layers 2 --heads 2 \
  --workload needles > /dev/null
"$flashlab" stream serve "$work/store" --port 0 --exit-after 100 > "$work/serve.log" 2>&1 &
server=$!
port=""
for _ in $(seq 100); do
  port=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1 | sed 's/.*://') || true
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || fail "the server did not say where it listens: $(cat "$work/serve.log")"
url="http://127.0.0.1:$port/#click=0.52&route=0-63:1024-1087"
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$work/profile"
       --window-size=1200,900 --virtual-time-budget=3000)
timeout 90 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "$url" > "$work/dom.html" 2> "$work/chrome.log" \
  || fail "chromium exited with $?: $(tail -5 "$work/chrome.log")"

grep -q 'data-state="answered"' "$work/dom.html" || fail "the page did not answer the click (body data-state)"
grep -q 'data-overview="drawn"' "$work/dom.html" || fail "the overview was not drawn"
ink=$(grep -o 'data-ink-pixels="[0-9]*"' "$work/dom.html" | grep -o '[0-9]*' || echo 0)
[ "${ink:-0}" -gt 1000 ] || fail "the overview canvas holds only ${ink:-0} drawn pixels"
reads=$(sed -n 's/.*<ol id="reads">\(.*\)<\/ol>.*/\1/p' "$work/dom.html" | grep -o '<li' | wc -l)
[ "$reads" -gt 0 ] || fail "the reads list is empty after the click"
grep -q '<ol id="route"><li' "$work/dom.html" || fail "the route list is empty"
if grep -q 'data-errors=' "$work/dom.html"; then fail "page error: $(grep -o 'data-errors="[^"]*"' "$work/dom.html")"; fi
if grep -q 'CONSOLE' "$work/chrome.log"; then fail "console messages: $(grep CONSOLE "$work/chrome.log")"; fi
echo "viewer: overview drawn ($ink pixels), click answered ($reads reads listed), route listed, no console messages"

if [ -n "$shot" ]; then
  timeout 90 "$browser" "${flags[@]}" --screenshot="$shot" "$url" 2> /dev/null || fail "screenshot failed"
  echo "screenshot: $shot"
fi
