#!/bin/sh
# The tests of greet.sh. Each check prints ok or FAIL; the exit status is
# the number of failures.
fail=0
check() {
	want=$1
	shift
	got=$(sh ./greet.sh "$@")
	if [ "$got" = "$want" ]; then
		echo "ok   greet.sh $*"
	else
		echo "FAIL greet.sh $*: got '$got', want '$want'"
		fail=$((fail + 1))
	fi
}
check "Hello, Ada!" Ada
check "Hello, world!"
check "Hello, Grace Hopper!" "Grace Hopper"
exit $fail
