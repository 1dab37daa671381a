//! The searched program decides exactly as the former compilation did: one linear program per
//! action built by `seccompiler` (plus the x32 guard), combined the kernel's way. Both run in a
//! classic BPF interpreter for every syscall number of the table and beyond, every
//! architecture value that matters, and argument values at and around every condition of the
//! policy.

use super::bpf::*;
use super::*;

/// `struct seccomp_data` as the filter reads it.
#[derive(Clone, Copy)]
struct Data {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

impl Data {
    fn word(&self, off: u32) -> u32 {
        match off {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0, // instruction pointer
            o if (16..64).contains(&o) && o % 4 == 0 => {
                let a = self.args[((o - 16) / 8) as usize];
                if (o - 16) % 8 == 0 {
                    a as u32
                } else {
                    (a >> 32) as u32
                }
            }
            o => panic!("load outside seccomp_data at {o}"),
        }
    }
}

/// Run one classic BPF program (the subset seccomp filters use) to its return value.
fn run(program: &[Insn], d: &Data) -> u32 {
    run_counted(program, d).0
}

/// Instructions executed to decide.
fn steps(program: &[Insn], d: &Data) -> usize {
    run_counted(program, d).1
}

/// The return value and the number of instructions executed.
fn run_counted(program: &[Insn], d: &Data) -> (u32, usize) {
    let (mut a, mut x, mut mem) = (0u32, 0u32, [0u32; 16]);
    let mut pc = 0usize;
    for executed in 1.. {
        let (code, jt, jf, k) = program[pc];
        pc += 1;
        let jump = |cond: bool| {
            if cond {
                usize::from(jt)
            } else {
                usize::from(jf)
            }
        };
        match code {
            0x20 => a = d.word(k),          // ld w abs
            0x00 => a = k,                  // ld imm
            0x01 => x = k,                  // ldx imm
            0x60 => a = mem[k as usize],    // ld mem
            0x61 => x = mem[k as usize],    // ldx mem
            0x02 => mem[k as usize] = a,    // st
            0x03 => mem[k as usize] = x,    // stx
            0x54 => a &= k,                 // and k
            0x44 => a |= k,                 // or k
            0x07 => x = a,                  // tax
            0x87 => a = x,                  // txa
            0x05 => pc += k as usize,       // ja
            0x15 => pc += jump(a == k),     // jeq k
            0x25 => pc += jump(a > k),      // jgt k
            0x35 => pc += jump(a >= k),     // jge k
            0x45 => pc += jump(a & k != 0), // jset k
            0x1d => pc += jump(a == x),     // jeq x
            0x06 => return (k, executed),   // ret k
            0x16 => return (a, executed),   // ret a
            other => panic!("opcode {other:#x} not interpreted"),
        }
    }
    unreachable!("a program without end")
}

/// The highest syscall number of an architecture's table.
fn max_nr(arch: &str) -> u32 {
    syscalls::syscall_table(arch)
        .unwrap()
        .iter()
        .map(|(_, nr)| *nr as u32)
        .max()
        .unwrap()
}

/// The kernel's choice among the results of several programs: the most restrictive action
/// (compared as signed, `KILL_PROCESS` lowest), the most recently installed on a tie.
fn combined(programs: &[Vec<Insn>], d: &Data) -> u32 {
    const ACTION_FULL: u32 = 0xffff_0000;
    let mut ret = RET_ALLOW;
    for p in programs.iter().rev() {
        let cur = run(p, d);
        if ((cur & ACTION_FULL) as i32) < ((ret & ACTION_FULL) as i32) {
            ret = cur;
        }
    }
    ret
}

/// The former compilation: the x32 guard, then one `seccompiler` program per action.
fn linear_reference(policy: &SeccompPolicy, arch: &str) -> Vec<Vec<Insn>> {
    let target = match arch {
        "x86_64" => seccompiler::TargetArch::x86_64,
        _ => seccompiler::TargetArch::aarch64,
    };
    let mut by_action: BTreeMap<
        SeccompAction,
        BTreeMap<i64, Option<Vec<seccompiler::SeccompRule>>>,
    > = BTreeMap::new();
    for rule in policy.rules() {
        let Some(nr) = syscall_nr(arch, &rule.syscall) else {
            continue;
        };
        let entry = by_action
            .entry(rule.action)
            .or_default()
            .entry(nr)
            .or_insert_with(|| Some(Vec::new()));
        if rule.args.is_empty() {
            *entry = None;
            continue;
        }
        let Some(chain) = entry else { continue };
        let conditions = rule
            .args
            .iter()
            .map(|c| {
                let width = match c.width {
                    ArgWidth::Dword => seccompiler::SeccompCmpArgLen::Dword,
                    ArgWidth::Qword => seccompiler::SeccompCmpArgLen::Qword,
                };
                let op = match c.op {
                    ArgOp::Eq => seccompiler::SeccompCmpOp::Eq,
                    ArgOp::Ne => seccompiler::SeccompCmpOp::Ne,
                    ArgOp::Lt => seccompiler::SeccompCmpOp::Lt,
                    ArgOp::Le => seccompiler::SeccompCmpOp::Le,
                    ArgOp::Gt => seccompiler::SeccompCmpOp::Gt,
                    ArgOp::Ge => seccompiler::SeccompCmpOp::Ge,
                    ArgOp::MaskedEq(m) => seccompiler::SeccompCmpOp::MaskedEq(m),
                };
                seccompiler::SeccompCondition::new(c.index, width, op, c.value).unwrap()
            })
            .collect();
        chain.push(seccompiler::SeccompRule::new(conditions).unwrap());
    }
    let mut programs = Vec::new();
    if arch == "x86_64" {
        programs.push(vec![
            (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
            (BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            (BPF_RET_K, 0, 0, RET_KILL_PROCESS),
            (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
            (BPF_JGE_K, 0, 2, X32_SYSCALL_BIT),
            (BPF_JEQ_K, 1, 0, u32::MAX),
            (BPF_RET_K, 0, 0, RET_KILL_PROCESS),
            (BPF_RET_K, 0, 0, RET_ALLOW),
        ]);
    }
    for (action, syscalls) in by_action {
        let on_match = match action {
            SeccompAction::KillProcess => seccompiler::SeccompAction::KillProcess,
            SeccompAction::Errno(e) => seccompiler::SeccompAction::Errno(e.unsigned_abs()),
        };
        let rules = syscalls
            .into_iter()
            .map(|(nr, chain)| (nr, chain.unwrap_or_default()))
            .collect();
        let filter = seccompiler::SeccompFilter::new(
            rules,
            seccompiler::SeccompAction::Allow,
            on_match,
            target,
        )
        .unwrap();
        let bpf: seccompiler::BpfProgram = filter.try_into().unwrap();
        programs.push(bpf.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect());
    }
    programs
}

/// Argument vectors around every condition of the policy: each value, one off either side,
/// with other bits and the high word set or cleared, and the mask's bits alone.
fn argument_cases(policy: &SeccompPolicy) -> Vec<[u64; 6]> {
    let mut cases = vec![[0u64; 6], [u64::MAX; 6], [0xffff_ffff; 6], [1 << 32; 6]];
    for rule in policy.rules() {
        for c in &rule.args {
            let mask = match c.op {
                ArgOp::MaskedEq(m) => m,
                _ => 0,
            };
            let v = c.value;
            let mut values = vec![
                v,
                v.wrapping_add(1),
                v.wrapping_sub(1),
                v | (1 << 32),
                v | 0xffff_ffff_0000_0000,
                v ^ mask,
                mask,
                v | !mask,
                v & !1,
                !v,
            ];
            values.dedup();
            for val in values {
                for base in [0u64, u64::MAX] {
                    let mut args = [base; 6];
                    args[usize::from(c.index)] = val;
                    cases.push(args);
                }
            }
        }
    }
    cases
}

fn decisions_match(policy: &SeccompPolicy, arch: &str) {
    let old = linear_reference(policy, arch);
    let new = policy.compile_for(arch).unwrap().programs;
    let audit = if arch == "x86_64" {
        AUDIT_ARCH_X86_64
    } else {
        AUDIT_ARCH_AARCH64
    };
    let max_nr = max_nr(arch);
    let mut nrs: Vec<u32> = (0..=max_nr + 64).collect();
    nrs.extend([X32_SYSCALL_BIT - 1, X32_SYSCALL_BIT, X32_SYSCALL_BIT + 1]);
    nrs.extend((0..=max_nr).map(|n| n | X32_SYSCALL_BIT));
    nrs.extend([u32::MAX, u32::MAX - 1, 0x8000_0000, 0xffff]);
    let args = argument_cases(policy);
    let (mut checked, mut denied) = (0usize, 0usize);
    for arch_value in [
        audit,
        0x4000_0003, /* i386 */
        AUDIT_ARCH_AARCH64,
        AUDIT_ARCH_X86_64,
        0,
    ] {
        for &nr in &nrs {
            for a in &args {
                let d = Data {
                    nr,
                    arch: arch_value,
                    args: *a,
                };
                let (want, got) = (combined(&old, &d), combined(&new, &d));
                assert_eq!(
                    got, want,
                    "{arch}: nr {nr} arch {arch_value:#x} args {a:x?}: {got:#x} instead of {want:#x}"
                );
                checked += 1;
                denied += usize::from(want != RET_ALLOW);
            }
        }
    }
    // Both outcomes were exercised, the denials of the policy among them.
    assert!(denied > 0 && denied < checked, "{denied} of {checked}");
}

#[test]
fn x86_64_decisions_are_those_of_the_linear_programs_for_every_syscall() {
    decisions_match(&SeccompPolicy::embedded().unwrap(), "x86_64");
}

#[test]
fn aarch64_decisions_are_those_of_the_linear_programs_for_every_syscall() {
    decisions_match(&SeccompPolicy::embedded().unwrap(), "aarch64");
}

/// Every comparison at both widths, several conditions in one rule, several rules for one
/// syscall, and both actions on one syscall (the embedded policy uses only some of them).
const EVERY_OPERATOR: &str = r#"
[[rule]]
syscall = "read"
args = [{ index = 0, op = "eq", value = 0x1_0000_0007 }]
action = "errno"
why = "qword eq"
[[rule]]
syscall = "read"
args = [{ index = 2, width = "dword", op = "ne", value = 5 }, { index = 1, op = "gt", value = 0x2_0000_0000 }]
action = "errno"
why = "dword ne and qword gt"
[[rule]]
syscall = "write"
args = [{ index = 1, op = "ge", value = 0x1_8000_0000 }]
action = "kill_process"
why = "qword ge"
[[rule]]
syscall = "write"
args = [{ index = 2, op = "lt", value = 0x3_0000_0010 }, { index = 3, op = "le", value = 0x7fff_ffff }]
action = "errno"
errno = "EIO"
why = "qword lt and le"
[[rule]]
syscall = "openat"
args = [{ index = 2, op = "ne", value = 0x1_0000_0000 }, { index = 4, op = "masked_eq", mask = 0xff00_0000_00ff, value = 0x1200_0000_0034 }]
action = "errno"
errno = "EACCES"
why = "qword ne and masked_eq"
[[rule]]
syscall = "close"
args = [{ index = 0, width = "dword", op = "gt", value = 100 }]
action = "errno"
why = "dword gt"
[[rule]]
syscall = "close"
args = [{ index = 0, width = "dword", op = "le", value = 2 }]
action = "errno"
why = "dword le"
[[rule]]
syscall = "dup"
args = [{ index = 0, width = "dword", op = "ge", value = 7 }, { index = 0, width = "dword", op = "lt", value = 9 }]
action = "kill_process"
why = "dword ge and lt"
[[rule]]
syscall = "dup"
args = [{ index = 5, width = "dword", op = "masked_eq", mask = 0xf0, value = 0x30 }]
action = "errno"
why = "dword masked_eq"
[[rule]]
syscall = "dup"
action = "errno"
why = "and otherwise always"
[[rule]]
syscall = "getpid"
action = "kill_process"
why = "unconditional kill"
[[rule]]
syscall = "getpid"
action = "errno"
why = "under a kill"
"#;

#[test]
fn every_operator_and_width_decides_as_the_linear_programs() {
    let policy = SeccompPolicy::from_toml(EVERY_OPERATOR, "every-operator.toml").unwrap();
    decisions_match(&policy, "x86_64");
    decisions_match(&policy, "aarch64");
}

#[test]
fn every_syscall_is_decided_in_a_few_comparisons() {
    // The point of the search: a number is decided after O(log n) instructions, not after a
    // scan of the whole list (the kernel emulates the program once per number at install).
    let policy = SeccompPolicy::embedded().unwrap();
    let new = &policy.compile_for("x86_64").unwrap().programs[0];
    let old = linear_reference(&policy, "x86_64");
    // Syscalls whose decision reads arguments run their rule checks after the search.
    let conditional: Vec<u32> = policy
        .rules()
        .iter()
        .filter(|r| !r.args.is_empty())
        .filter_map(|r| syscall_nr("x86_64", &r.syscall))
        .map(|nr| nr as u32)
        .collect();
    let (mut worst_new, mut total_new, mut total_old) = (0, 0, 0);
    for nr in (0..=max_nr("x86_64")).filter(|nr| !conditional.contains(nr)) {
        let d = Data {
            nr,
            arch: AUDIT_ARCH_X86_64,
            args: [0; 6],
        };
        let n = steps(new, &d);
        worst_new = worst_new.max(n);
        total_new += n;
        total_old += old.iter().map(|p| steps(p, &d)).sum::<usize>();
    }
    assert!(worst_new <= 16, "a syscall took {worst_new} instructions");
    assert!(!conditional.is_empty());
    assert!(
        total_new * 5 < total_old,
        "{total_new} instructions over all syscalls against {total_old}"
    );
}
