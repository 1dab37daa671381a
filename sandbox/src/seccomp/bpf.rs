//! The policy as one classic BPF program: the architecture check, then a binary search over the
//! denied syscall numbers, each leaf the syscall's rules in precedence order.
//!
//! Why one searched program rather than one linear scan per action: the kernel runs every
//! installed program on each syscall its per-syscall cache cannot answer, and when a program is
//! installed it emulates the program once per syscall number to fill that cache. A linear scan
//! of all denied numbers costs each of those runs up to the whole list; the search costs its
//! depth (a handful of comparisons). The decisions are the same, syscall for syscall: a leaf
//! checks the `kill_process` rules first, then the `errno` rules (the kernel's precedence
//! between programs, and a syscall has at most one errno), then allows.
//!
//! Layout (every path ends in a `RET`, so blocks are position independent):
//! ```text
//! ld arch; jeq AUDIT_ARCH ? +1 : 0; ret KILL_PROCESS; ld nr
//! [x86_64: nr >= 0x40000000 (x32 ABI) and nr != -1 -> ret KILL_PROCESS]
//! search(nrs): jge nrs[mid] ? right : left   (a short run of jeq at the bottom; else ret ALLOW)
//! leaf(nr):    for each rule: its argument checks (a failed check skips the rule), ret action
//!              ret ALLOW
//! ```

use super::{ArgCondition, ArgOp, ArgWidth, SeccompAction};
use std::collections::BTreeMap;

/// One instruction, `(code, jt, jf, k)` as in `struct sock_filter`.
pub type Insn = (u16, u8, u8, u32);

// Classic BPF opcodes (linux/bpf_common.h, linux/seccomp.h, linux/audit.h).
pub(super) const BPF_LD_W_ABS: u16 = 0x20;
pub(super) const BPF_JA: u16 = 0x05;
pub(super) const BPF_JEQ_K: u16 = 0x15;
pub(super) const BPF_JGT_K: u16 = 0x25;
pub(super) const BPF_JGE_K: u16 = 0x35;
pub(super) const BPF_AND_K: u16 = 0x54;
pub(super) const BPF_RET_K: u16 = 0x06;
pub(super) const SECCOMP_DATA_NR: u32 = 0;
pub(super) const SECCOMP_DATA_ARCH: u32 = 4;
/// Offset of `args[0]` in `struct seccomp_data`; each argument is 8 bytes, low word first
/// (both supported architectures are little-endian).
const SECCOMP_DATA_ARGS: u32 = 16;
pub(super) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
pub(super) const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
pub(super) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
pub(super) const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(super) const RET_ERRNO: u32 = 0x0005_0000;
pub(super) const RET_ALLOW: u32 = 0x7fff_0000;

/// At most this many syscalls are compared one by one at the bottom of the search.
const LINEAR_RUN: usize = 4;

/// The rules of one syscall: `(action, conditions)`; no condition means always.
pub(super) type NrRules = Vec<(SeccompAction, Vec<ArgCondition>)>;

fn ret(k: u32) -> Insn {
    (BPF_RET_K, 0, 0, k)
}

fn ret_action(a: SeccompAction) -> Insn {
    match a {
        SeccompAction::KillProcess => ret(RET_KILL_PROCESS),
        SeccompAction::Errno(e) => ret(RET_ERRNO | (e.unsigned_abs() & 0xffff)),
    }
}

fn load(offset: u32) -> Insn {
    (BPF_LD_W_ABS, 0, 0, offset)
}

/// A relative jump: it must fit the 8-bit field.
fn offset(n: usize) -> Result<u8, String> {
    u8::try_from(n).map_err(|_| format!("a jump of {n} instructions does not fit a rule block"))
}

/// The checks of one condition: fall through when it holds, else jump `skip` instructions past
/// the end of this code.
fn condition(c: &ArgCondition, skip: usize) -> Result<Vec<Insn>, String> {
    let lo = SECCOMP_DATA_ARGS + 8 * u32::from(c.index);
    let hi = lo + 4;
    // A jump at position `p` of a code of length `len`: to the end of the code (the condition
    // holds) or past it by `skip` (it does not).
    let holds = |len: usize, p: usize| offset(len - p - 1);
    let fails = |len: usize, p: usize| offset(len - p - 1 + skip);
    let (vh, vl) = ((c.value >> 32) as u32, c.value as u32);
    Ok(match (c.width, c.op) {
        (ArgWidth::Dword, ArgOp::MaskedEq(m)) => vec![
            load(lo),
            (BPF_AND_K, 0, 0, m as u32),
            (BPF_JEQ_K, 0, fails(3, 2)?, vl),
        ],
        (ArgWidth::Dword, op) => {
            let f = fails(2, 1)?;
            let (code, jt, jf) = match op {
                ArgOp::Eq => (BPF_JEQ_K, 0, f),
                ArgOp::Ne => (BPF_JEQ_K, f, 0),
                ArgOp::Gt => (BPF_JGT_K, 0, f),
                ArgOp::Ge => (BPF_JGE_K, 0, f),
                ArgOp::Lt => (BPF_JGE_K, f, 0),
                ArgOp::Le | ArgOp::MaskedEq(_) => (BPF_JGT_K, f, 0),
            };
            vec![load(lo), (code, jt, jf, vl)]
        }
        (ArgWidth::Qword, ArgOp::MaskedEq(m)) => vec![
            load(hi),
            (BPF_AND_K, 0, 0, (m >> 32) as u32),
            (BPF_JEQ_K, 0, fails(6, 2)?, vh),
            load(lo),
            (BPF_AND_K, 0, 0, m as u32),
            (BPF_JEQ_K, 0, fails(6, 5)?, vl),
        ],
        (ArgWidth::Qword, ArgOp::Eq) => vec![
            load(hi),
            (BPF_JEQ_K, 0, fails(4, 1)?, vh),
            load(lo),
            (BPF_JEQ_K, 0, fails(4, 3)?, vl),
        ],
        (ArgWidth::Qword, ArgOp::Ne) => vec![
            load(hi),
            (BPF_JEQ_K, 0, holds(4, 1)?, vh),
            load(lo),
            (BPF_JEQ_K, fails(4, 3)?, 0, vl),
        ],
        // a > v (a >= v): the high words decide unless equal, then the low words;
        // a < v is not (a >= v), a <= v is not (a > v).
        (ArgWidth::Qword, op) => {
            let low = if matches!(op, ArgOp::Gt | ArgOp::Le) {
                BPF_JGT_K
            } else {
                BPF_JGE_K
            };
            let (above, equal, (t, f)) = if matches!(op, ArgOp::Gt | ArgOp::Ge) {
                (holds(5, 1)?, fails(5, 2)?, (0, fails(5, 4)?))
            } else {
                (fails(5, 1)?, holds(5, 2)?, (fails(5, 4)?, 0))
            };
            vec![
                load(hi),
                (BPF_JGT_K, above, 0, vh),
                (BPF_JEQ_K, 0, equal, vh),
                load(lo),
                (low, t, f, vl),
            ]
        }
    })
}

/// The code of one syscall once its number matched: its rules in precedence order
/// (`kill_process` before `errno`, file order within), each a block of checks ending in its
/// action; an unconditional rule ends the leaf; else the syscall is allowed.
fn leaf(rules: &NrRules) -> Result<Vec<Insn>, String> {
    let mut ordered: Vec<&(SeccompAction, Vec<ArgCondition>)> = rules.iter().collect();
    ordered.sort_by_key(|(a, _)| *a); // stable: KillProcess < Errno(_)
    let mut out = Vec::new();
    for (action, conds) in ordered {
        let mut block = vec![ret_action(*action)];
        if conds.is_empty() {
            out.extend(block);
            return Ok(out);
        }
        for c in conds.iter().rev() {
            let mut code = condition(c, block.len())?;
            code.extend(block);
            block = code;
        }
        out.extend(block);
    }
    out.push(ret(RET_ALLOW));
    Ok(out)
}

/// `jump` to the block `len` instructions ahead when a comparison holds, with a `JA` when the
/// distance does not fit the 8-bit field: `(cmp, k)` true runs what follows, false skips `len`.
fn skip_unless(out: &mut Vec<Insn>, cmp: u16, k: u32, len: usize) -> Result<(), String> {
    match u8::try_from(len) {
        Ok(n) => out.push((cmp, 0, n, k)),
        Err(_) => {
            let far = u32::try_from(len).map_err(|_| "program too long".to_string())?;
            out.push((cmp, 1, 0, k));
            out.push((BPF_JA, 0, 0, far));
        }
    }
    Ok(())
}

/// Binary search over sorted syscall numbers with their leaves; the number is in `A`.
fn search(entries: &[(u32, Vec<Insn>)]) -> Result<Vec<Insn>, String> {
    let mut out = Vec::new();
    if entries.len() <= LINEAR_RUN {
        for (nr, code) in entries {
            skip_unless(&mut out, BPF_JEQ_K, *nr, code.len())?;
            out.extend_from_slice(code);
        }
        out.push(ret(RET_ALLOW));
        return Ok(out);
    }
    let mid = entries.len() / 2;
    let left = search(&entries[..mid])?;
    let right = search(&entries[mid..])?;
    // `A < entries[mid]` runs the left half, which follows; else jump over it.
    match u8::try_from(left.len()) {
        Ok(n) => out.push((BPF_JGE_K, n, 0, entries[mid].0)),
        Err(_) => {
            let far = u32::try_from(left.len()).map_err(|_| "program too long".to_string())?;
            out.push((BPF_JGE_K, 0, 1, entries[mid].0));
            out.push((BPF_JA, 0, 0, far));
        }
    }
    out.extend(left);
    out.extend(right);
    Ok(out)
}

/// The whole program: `audit` is the architecture's `AUDIT_ARCH_*` (any other is killed);
/// `x32` adds the x86_64 guard against x32-ABI syscall numbers.
pub(super) fn program(
    audit: u32,
    x32: bool,
    by_nr: &BTreeMap<u32, NrRules>,
) -> Result<Vec<Insn>, String> {
    let mut out = vec![
        load(SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 1, 0, audit),
        ret(RET_KILL_PROCESS),
        load(SECCOMP_DATA_NR),
    ];
    if x32 {
        // The x32 ABI shares AUDIT_ARCH_X86_64 but numbers its syscalls from 0x40000000,
        // which would bypass a list keyed on x86_64 numbers: kill them (except nr == -1,
        // which the kernel answers with ENOSYS anyway).
        out.extend([
            (BPF_JGE_K, 0, 2, X32_SYSCALL_BIT),
            (BPF_JEQ_K, 1, 0, u32::MAX),
            ret(RET_KILL_PROCESS),
        ]);
    }
    let entries = by_nr
        .iter()
        .map(|(nr, rules)| Ok((*nr, leaf(rules)?)))
        .collect::<Result<Vec<_>, String>>()?;
    out.extend(search(&entries)?);
    Ok(out)
}
