#!/bin/sh
# greet.sh [NAME]: greet NAME, or the world when no name is given.
name=$1
echo "Hello, $name!"
