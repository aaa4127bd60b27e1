#!/bin/sh
# The tests of count.sh. Each check prints ok or FAIL; the exit status is
# the number of failures.
fail=0
check() {
	got=$(sh ./count.sh "$2")
	if [ "$got" = "$1" ]; then
		echo "ok   count.sh $2"
	else
		echo "FAIL count.sh $2: got '$got', want '$1'"
		fail=$((fail + 1))
	fi
}
check 3 fixtures/three.txt
check 0 fixtures/blank.txt
exit $fail
