#!/bin/sh
# Put `memosfs` where mount(8) finds it.
#
# `mount -t fuse.memosfs memos /mnt/memos -o opts` runs /sbin/mount.fuse3, which
# runs `/bin/sh -c "memosfs memos /mnt/memos -o opts"` with PATH reset to
# /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.  A venv's bin/
# is not on that PATH, so this installs a small wrapper as /usr/local/bin/memosfs.
#
# Usage: install.sh /abs/path/to/.venv/bin/memosfs [DEST]
set -eu
target=${1:?usage: install.sh /abs/path/to/venv/bin/memosfs [DEST]}
dest=${2:-/usr/local/bin/memosfs}
case "$target" in /*) ;; *) echo "install.sh: give an absolute path" >&2; exit 2;; esac
[ -x "$target" ] || { echo "install.sh: $target is not executable" >&2; exit 1; }
tmp="$dest.tmp.$$"
printf '#!/bin/sh\n# installed by memosfs mountscripts/install.sh\nexec %s "$@"\n' "$target" > "$tmp"
chmod 755 "$tmp"
mv "$tmp" "$dest"
echo "installed $dest -> $target"
