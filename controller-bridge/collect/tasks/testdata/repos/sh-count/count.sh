#!/bin/sh
# count.sh FILE: print how many lines of FILE hold something other than
# spaces and tabs.
grep -c '' "$1"
