#!/usr/bin/env bash
# Runs lmscale on a bad deck and checks that it stops before any work:
#   exit code 2, a `lmscale: error: ...` line on stderr naming the key from the deck's first line
#   (`# expect: KEY`), and no results file (neither out.h5 nor out.h5.tmp).
# Usage: check_bad_deck.sh LMSCALE DECK.ini
#        check_bad_deck.sh LMSCALE --missing     (a deck path that does not exist: names the path)
set -u
lmscale=$1
deck=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "$deck" = "--missing" ]; then
  deck="$tmp/no_such_deck.ini"
  expect="$deck"
else
  expect=$(sed -n '1s/^#[[:space:]]*expect:[[:space:]]*//p' "$deck")
  if [ -z "$expect" ]; then
    echo "FAIL: $deck: the first line must be '# expect: KEY'"
    exit 1
  fi
fi

"$lmscale" "$deck" --run.output="$tmp/out.h5" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
fail=0
if [ "$rc" -ne 2 ]; then
  echo "FAIL: exit code $rc, expected 2"
  fail=1
fi
if ! grep -F 'lmscale: error:' "$tmp/stderr" | grep -qF -- "$expect"; then
  echo "FAIL: no 'lmscale: error:' line on stderr mentions '$expect'"
  fail=1
fi
for f in "$tmp/out.h5" "$tmp/out.h5.tmp"; do
  if [ -e "$f" ]; then
    echo "FAIL: $(basename "$f") was created although the deck is bad"
    fail=1
  fi
done
echo "--- stderr:"
cat "$tmp/stderr"
echo "--- stdout:"
cat "$tmp/stdout"
[ "$fail" -eq 0 ] && echo "PASS: $deck"
exit "$fail"
