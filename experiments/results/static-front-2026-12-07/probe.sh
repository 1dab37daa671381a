#!/usr/bin/env bash
# probe.sh: why a glibc program starts slowly in a virtual machine. Times (hyperfine, 300 runs)
# a program with no libc that exits at once, the same `return 0` linked statically with glibc,
# and /bin/true; and the cost of one CPUID instruction (cpuid.c: 2000 of each leaf 0-4).
# Needs gcc and hyperfine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
printf 'void _start(void){ __asm__ volatile("mov $60,%%eax; xor %%edi,%%edi; syscall"); }\n' > "$t/nolibc.c"
printf 'int main(void){ return 0; }\n' > "$t/glibc.c"
gcc -O2 -static -nostdlib -o "$t/nolibc" "$t/nolibc.c"
gcc -O2 -static -o "$t/static-glibc" "$t/glibc.c"
gcc -O2 -o "$t/cpuid" "$here/cpuid.c"
"$t/cpuid"
hyperfine -N --warmup 20 --runs 300 "$t/nolibc" "$t/static-glibc" /bin/true
