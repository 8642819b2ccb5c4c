#!/bin/sh
# A launcher script that stays the parent of the server it starts (to clean up after it).
node "$@"
exit $?
