#!/bin/bash
# Used by docs/harbor.md's measured run: benches/harbor-rootfs.sh DIR writes DIR and DIR.tar,
# then `docker import DIR.tar debian:bookworm` gives the fixtures' FROM an image of the daemon.
# A small Debian-like root filesystem from host programs: shells, coreutils, python3 with pytest.
set -e
r=$1; rm -rf $r; mkdir -p $r/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc,tmp,root,proc,dev,sys,run,var/tmp,home}
ln -s usr/bin $r/bin; ln -s usr/sbin $r/sbin; ln -s usr/lib $r/lib; ln -s usr/lib64 $r/lib64
put() { m=$(echo $1 | sed "s@^/lib/@/usr/lib/@; s@^/lib64/@/usr/lib64/@; s@^/bin/@/usr/bin/@; s@^/sbin/@/usr/sbin/@"); for x in $m $(readlink -f $m); do mkdir -p $r$(dirname $x); cp -a $x $r$x; done; }
for p in sh bash dash cat mkdir rm chmod chown grep tr test touch echo wc ls cp mv sed seq sleep id env true false head tail setsid nohup python3 python3.11 curl printf; do
  f=/usr/bin/$p; [ -e $f ] || f=/usr/sbin/$p
  put $f
  for l in $(ldd $(readlink -f $f) 2>/dev/null | grep -o '/[^ ]*'); do put $l; done
done
for x in /usr/lib/python3.11 /usr/lib/python3/dist-packages /etc/passwd /etc/group; do mkdir -p $r$(dirname $x); cp -a $x $r$x; done
chmod 1777 $r/tmp
tar -C $r -cf ${r}.tar .
