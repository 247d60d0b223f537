#!/bin/bash
# run.sh N ITERATIONS OLD-BINARY NEW-BINARY: inittime with N namespace
# mounts in a netns directory that is a mount of its own, as the agent's
# is, in a private mount namespace of this script's own (nothing is left
# on the host). Root; under flock -o /tmp/trialnet-priv.lock.
#   unshare -m --propagation private test/inittime/run.sh 1000 200 old.test new.test
set -euo pipefail
n=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'umount -R -l "$work/netns" 2>/dev/null; rm -rf "$work"' EXIT
gcc -O2 -Wall -o "$work/inittime" "$here/inittime.c"
dir=$work/netns
mkdir "$dir"
mount -t tmpfs -o size=1m tmpfs "$dir"
mount --make-shared "$dir"
for i in $(seq 1 "$n"); do
	touch "$dir/t$i"
	mount --bind /proc/self/ns/net "$dir/t$i"
done
touch "$dir/own"
unshare -n sh -c "mount --bind /proc/self/ns/net $dir/own"
echo "$n namespace mounts, $(wc -l </proc/self/mountinfo) mounts in all"
"$work/inittime" "$dir/own" "$2" "$3" "$4"
