#!/bin/sh
# Put `memosfs` where mount(8) finds it.
#
# `mount -t fuse.memosfs memos /mnt/memos -o opts` runs /sbin/mount.fuse3, which
# runs `/bin/sh -c "memosfs memos /mnt/memos -o opts"` with PATH reset to
# /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.  A venv's bin/
# is not on that PATH, so this installs a small wrapper as /usr/local/bin/memosfs.
#
# The wrapper runs the venv's memosfs, whose interpreter is the venv's Python.
# A user who cannot reach one of them (a checkout or a Python below a 0700
# home) would get the shell's bare "Permission denied"; the wrapper checks
# first and says which directory is private and what to do.  This script
# warns at install time when some users will not be able to run it.
#
# Usage: install.sh /abs/path/to/.venv/bin/memosfs [DEST]
set -eu
target=${1:?usage: install.sh /abs/path/to/venv/bin/memosfs [DEST]}
dest=${2:-/usr/local/bin/memosfs}
case "$target" in /*) ;; *) echo "install.sh: give an absolute path" >&2; exit 2;; esac
case "$target" in *"'"*|*[[:space:]]*) echo "install.sh: a path with a ' or a space in it is not supported" >&2; exit 2;; esac
[ -x "$target" ] || { echo "install.sh: $target is not executable" >&2; exit 1; }

# What running it takes: the program, the interpreter its #! line names, and
# each link on the way to the real one (a venv's python is a link to the
# Python it was made from, which may lie in a private home).
needs="$target"
first=$(head -c 256 "$target" | head -n 1)
case "$first" in
  '#!'*)
    p=$(printf '%s\n' "${first#??}" | awk '{print $1}')
    n=0
    while [ -n "$p" ] && [ $n -lt 16 ]; do
      case "$p" in *"'"*|*[[:space:]]*) break;; esac
      needs="$needs $p"
      [ -L "$p" ] || break
      next=$(readlink "$p")
      case "$next" in /*) ;; *) next="$(dirname "$p")/$next";; esac
      p=$next; n=$((n + 1))
    done;;
esac

# Directories on those paths that users other than their owner cannot search.
private=""
for p in $needs; do
  d=$(dirname "$p")
  while [ "$d" != "/" ]; do
    mode=$(stat -c %a "$d")
    case "$mode" in
      *[1357]) ;;
      *) case " $private " in *" $d "*) ;; *) private="$private $d";; esac;;
    esac
    d=$(dirname "$d")
  done
done

# The checkout the venv belongs to (CHECKOUT/VENV/bin/memosfs, beside its
# Makefile), for the wrapper's advice; empty when it is not one.
checkout=$(dirname "$(dirname "$(dirname "$target")")")
venv=$(basename "$(dirname "$(dirname "$target")")")
[ -f "$checkout/Makefile" ] || checkout=""

tmp="$dest.tmp.$$"
{
  printf '#!/bin/sh\n# installed by memosfs mountscripts/install.sh\n'
  printf '# runs %s; checks first that the caller can reach it and its Python\n' "$target"
  printf "target='%s'; checkout='%s'; venv='%s'\n" "$target" "$checkout" "$venv"
  printf 'for p in'
  for p in $needs; do printf " '%s'" "$p"; done
  printf '; do\n'
  cat <<'EOF'
  [ -x "$p" ] && continue
  who=$(id -un 2>/dev/null || id -u)
  d=$(dirname "$p"); top=""
  while [ "$d" != "/" ]; do [ -x "$d" ] || top=$d; d=$(dirname "$d"); done
  if [ -n "$top" ]; then
    why="$top is private to its owner (mode $(stat -c '%a, owner %U' "$top"))"
  elif [ -L "$p" ]; then
    continue                    # (a link: where it leads is checked next)
  else
    why="it is not executable for $who"
  fi
  echo "memosfs: user $who cannot run $p: $why." >&2
  if [ "$p" != "$target" ] && [ -n "$checkout" ] && [ -x "$checkout" ]; then
    # the checkout is reachable, the Python its venv was made from is not
    fix="make its venv from a Python every user can reach, as root: cd $checkout &&"
    fix="$fix make install PYTHON=/usr/bin/python3 VENV=$venv-shared"
  else
    fix="install it where every user can reach it: a checkout outside private homes"
    fix="$fix (e.g. /opt/memosfs) and, there, make install PYTHON=/usr/bin/python3"
  fi
  echo "memosfs: run memosfs as the user who installed it, or $fix" \
       "(docs/operating.md, \"Other users\")." >&2
  exit 126
done
EOF
  printf "exec '%s' \"\$@\"\n" "$target"
} > "$tmp"
chmod 755 "$tmp"
mv "$tmp" "$dest"
echo "installed $dest -> $target"
if [ -n "$private" ]; then
  for d in $private; do
    echo "install.sh: warning: $d is mode $(stat -c '%a, owner %U' "$d"): other" \
         "users may not be able to run memosfs; the wrapper tells them so and what" \
         "to do (docs/operating.md, \"Other users\")" >&2
  done
fi
