//! Seccomp policy as data: a deny list with default allow, read from
//! `sandbox/policy/seccomp.toml` (embedded at build time) and compiled to classic BPF
//! with `seccompiler`.
//!
//! Life cycle in the resident init (PID 1):
//! 1. [`SeccompPolicy::embedded`] parses and validates the file once (fail closed: an
//!    unknown syscall name, a missing `why`, a bad action or errno is an error naming the
//!    file, line and key);
//! 2. [`SeccompPolicy::compile`] builds one BPF program per distinct action for the
//!    running architecture (plus, on x86_64, a guard that kills x32-ABI syscalls);
//! 3. [`CompiledSeccomp::prepare`] converts them to `libc::sock_filter` buffers;
//! 4. after each `fork`, the child calls [`PreparedSeccomp::apply`] (or
//!    [`CompiledSeccomp::apply`]) right before `execve`; neither allocates.
//!
//! Every compiled program starts with seccompiler's architecture check, which returns
//! `SECCOMP_RET_KILL_PROCESS` for any other audit architecture (e.g. i386 syscalls made
//! through `int 0x80` on x86_64).
//!
//! Precedence: the kernel runs every installed program and keeps the strongest result
//! (`KILL_PROCESS` > `ERRNO` > `ALLOW`); between two `ERRNO` results the most recently
//! installed program wins. The loader therefore rejects a syscall listed with two
//! different errno values, so the order of the errno programs never matters.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

/// Text of the embedded default policy.
pub const EMBEDDED_POLICY: &str = include_str!("../policy/seccomp.toml");
/// Name used for the embedded policy in error messages.
pub const EMBEDDED_SOURCE: &str = "sandbox/policy/seccomp.toml";

/// Largest classic BPF program the kernel accepts (`BPF_MAXINSNS`).
pub const BPF_MAX_INSNS: usize = 4096;

/// Errors of loading, compiling or installing a seccomp policy.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The policy text is invalid: TOML syntax, a missing or unknown key, a bad value.
    #[error("{file}:{line}: key `{key}`: {reason}")]
    Policy {
        /// Source name given to [`SeccompPolicy::from_toml`].
        file: String,
        /// 1-based line of the offending item.
        line: usize,
        /// The offending key (`syscall`, `why`, `action`, ...).
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The validated policy could not be compiled to BPF.
    #[error("{file}: cannot compile for {arch}: {reason}")]
    Compile {
        /// Source name of the policy.
        file: String,
        /// Target architecture.
        arch: String,
        /// What went wrong.
        reason: String,
    },
    /// The running architecture has no syscall table here: the sandbox must not start.
    #[error("seccomp policies are not supported on architecture `{arch}`")]
    UnsupportedArch {
        /// The architecture name.
        arch: String,
    },
    /// A program is empty or longer than the kernel accepts.
    #[error("seccomp program {index} has {len} instructions; the kernel accepts 1..={max}")]
    ProgramSize {
        /// Index of the program in install order.
        index: usize,
        /// Its length.
        len: usize,
        /// [`BPF_MAX_INSNS`].
        max: usize,
    },
    /// Nothing to install (e.g. a deserialized, empty [`CompiledSeccomp`]): refusing to
    /// run unfiltered.
    #[error("no seccomp program to install; refusing to run unfiltered")]
    NoPrograms,
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("prctl(PR_SET_NO_NEW_PRIVS) failed with errno {errno}")]
    NoNewPrivs {
        /// The errno.
        errno: i32,
    },
    /// `seccomp(SECCOMP_SET_MODE_FILTER)` failed.
    #[error("seccomp(SECCOMP_SET_MODE_FILTER) failed for program {index} with errno {errno}")]
    Install {
        /// Index of the program in install order.
        index: usize,
        /// The errno.
        errno: i32,
    },
}

/// What the filter does when a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SeccompAction {
    /// Kill the whole process (`SECCOMP_RET_KILL_PROCESS`, SIGSYS).
    KillProcess,
    /// Fail the syscall with this errno (`SECCOMP_RET_ERRNO`).
    Errno(i32),
}

/// Width of an argument comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgWidth {
    /// Low 32 bits only (for `int`/`unsigned int` parameters).
    Dword,
    /// All 64 bits.
    Qword,
}

/// Comparison of a syscall argument with [`ArgCondition::value`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgOp {
    /// `arg == value`
    Eq,
    /// `arg != value`
    Ne,
    /// `arg < value`
    Lt,
    /// `arg <= value`
    Le,
    /// `arg > value`
    Gt,
    /// `arg >= value`
    Ge,
    /// `arg & mask == value`
    MaskedEq(u64),
}

/// One condition on a syscall argument; the conditions of a rule are ANDed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgCondition {
    /// Argument index, 0..=5.
    pub index: u8,
    /// Comparison width.
    pub width: ArgWidth,
    /// Comparison.
    pub op: ArgOp,
    /// Right-hand side.
    pub value: u64,
}

/// One validated `[[rule]]` of the policy file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeccompRule {
    /// Kernel syscall name.
    pub syscall: String,
    /// Action when the rule matches.
    pub action: SeccompAction,
    /// Argument conditions (ANDed); empty: the syscall always matches.
    pub args: Vec<ArgCondition>,
    /// Why the syscall is denied (mandatory, non-empty).
    pub why: String,
    /// 1-based line of the rule's `syscall` key in the source.
    pub line: usize,
}

/// A parsed and validated seccomp deny-list policy.
#[derive(Clone, Debug)]
pub struct SeccompPolicy {
    source: String,
    rules: Vec<SeccompRule>,
}

/// BPF programs in install order, one per distinct action (plus the x32 guard on
/// x86_64). Each instruction is `(code, jt, jf, k)` as in `struct sock_filter`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompiledSeccomp {
    /// The programs, in install order.
    pub programs: Vec<Vec<(u16, u8, u8, u32)>>,
}

/// [`CompiledSeccomp`] converted to kernel structures, ready to install without
/// allocating (build it in the parent, apply it in the forked child).
pub struct PreparedSeccomp {
    programs: Vec<Vec<libc::sock_filter>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    syscall: Option<Spanned<String>>,
    action: Option<Spanned<String>>,
    errno: Option<Spanned<String>>,
    args: Option<Vec<Spanned<RawArg>>>,
    why: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArg {
    index: Option<Spanned<i64>>,
    width: Option<Spanned<String>>,
    op: Option<Spanned<String>>,
    mask: Option<Spanned<i64>>,
    value: Option<Spanned<i64>>,
}

use crate::toml_pos::{line_of, quoted_key};

struct Ctx<'a> {
    text: &'a str,
    source: &'a str,
}

impl Ctx<'_> {
    fn err(&self, span: Range<usize>, key: &str, reason: impl Into<String>) -> SeccompError {
        SeccompError::Policy {
            file: self.source.to_string(),
            line: line_of(self.text, span.start),
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

/// Errno names accepted in `errno = "..."`.
const ERRNO_NAMES: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("ESRCH", libc::ESRCH),
    ("EIO", libc::EIO),
    ("ENXIO", libc::ENXIO),
    ("EBADF", libc::EBADF),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EACCES", libc::EACCES),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("ENODEV", libc::ENODEV),
    ("EINVAL", libc::EINVAL),
    ("ENOTTY", libc::ENOTTY),
    ("EROFS", libc::EROFS),
    ("ENOSYS", libc::ENOSYS),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("ENOTSUP", libc::ENOTSUP),
    ("EAFNOSUPPORT", libc::EAFNOSUPPORT),
    ("EPROTONOSUPPORT", libc::EPROTONOSUPPORT),
];

/// Architectures with a syscall table here.
const ARCHES: &[&str] = &["x86_64", "aarch64"];

fn syscall_table(arch: &str) -> Option<&'static [(&'static str, i64)]> {
    match arch {
        "x86_64" => Some(X86_64_SYSCALLS),
        "aarch64" => Some(AARCH64_SYSCALLS),
        _ => None,
    }
}

fn syscall_nr(arch: &str, name: &str) -> Option<i64> {
    syscall_table(arch)?
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, nr)| *nr)
}

/// A name is valid if at least one supported architecture has it.
fn is_known_syscall(name: &str) -> bool {
    ARCHES.iter().any(|arch| syscall_nr(arch, name).is_some())
}

impl SeccompPolicy {
    /// Parses the embedded default policy (`sandbox/policy/seccomp.toml`).
    pub fn embedded() -> Result<Self, SeccompError> {
        Self::from_toml(EMBEDDED_POLICY, EMBEDDED_SOURCE)
    }

    /// Parses and validates a policy. `source` names the text in errors, which carry
    /// the line, the key and the reason.
    pub fn from_toml(text: &str, source: &str) -> Result<Self, SeccompError> {
        let ctx = Ctx { text, source };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let key = quoted_key(e.message()).unwrap_or_else(|| "(syntax)".to_string());
            ctx.err(span, &key, e.message().trim().to_string())
        })?;
        if raw.rule.is_empty() {
            return Err(ctx.err(0..0, "rule", "the policy has no [[rule]]"));
        }
        let mut rules = Vec::with_capacity(raw.rule.len());
        // syscall -> (errno, line) of the first errno rule, to reject ambiguous precedence.
        let mut errno_of: BTreeMap<String, (i32, usize)> = BTreeMap::new();
        for spanned in raw.rule {
            let rule_span = spanned.span();
            let rule = parse_rule(&ctx, rule_span, spanned.into_inner())?;
            if let SeccompAction::Errno(errno) = rule.action {
                match errno_of.get(&rule.syscall) {
                    Some((first, first_line)) if *first != errno => {
                        return Err(SeccompError::Policy {
                            file: source.to_string(),
                            line: rule.line,
                            key: "errno".to_string(),
                            reason: format!(
                                "`{}` already has errno {} (line {}); two errno values for one \
                                 syscall make the result depend on filter order",
                                rule.syscall, first, first_line
                            ),
                        });
                    }
                    Some(_) => {}
                    None => {
                        errno_of.insert(rule.syscall.clone(), (errno, rule.line));
                    }
                }
            }
            rules.push(rule);
        }
        tracing::debug!(source, rules = rules.len(), "seccomp policy loaded");
        Ok(Self {
            source: source.to_string(),
            rules,
        })
    }

    /// The validated rules, in file order.
    pub fn rules(&self) -> &[SeccompRule] {
        &self.rules
    }

    /// Compiles the policy for the running architecture.
    pub fn compile(&self) -> Result<CompiledSeccomp, SeccompError> {
        self.compile_for(std::env::consts::ARCH)
    }

    /// Compiles the policy for `arch` (`"x86_64"` or `"aarch64"`). Rules naming a syscall
    /// that `arch` does not have are skipped (it cannot be called there).
    pub fn compile_for(&self, arch: &str) -> Result<CompiledSeccomp, SeccompError> {
        let target = match arch {
            "x86_64" => seccompiler::TargetArch::x86_64,
            "aarch64" => seccompiler::TargetArch::aarch64,
            _ => {
                return Err(SeccompError::UnsupportedArch {
                    arch: arch.to_string(),
                })
            }
        };
        let compile_err = |reason: String| SeccompError::Compile {
            file: self.source.clone(),
            arch: arch.to_string(),
            reason,
        };
        // action -> syscall number -> rules; `None` marks an unconditional match.
        let mut by_action: BTreeMap<
            SeccompAction,
            BTreeMap<i64, Option<Vec<seccompiler::SeccompRule>>>,
        > = BTreeMap::new();
        for rule in &self.rules {
            let Some(nr) = syscall_nr(arch, &rule.syscall) else {
                tracing::debug!(syscall = %rule.syscall, arch, line = rule.line, "syscall absent on this architecture; rule skipped");
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
            let mut conditions = Vec::with_capacity(rule.args.len());
            for cond in &rule.args {
                let width = match cond.width {
                    ArgWidth::Dword => seccompiler::SeccompCmpArgLen::Dword,
                    ArgWidth::Qword => seccompiler::SeccompCmpArgLen::Qword,
                };
                let op = match cond.op {
                    ArgOp::Eq => seccompiler::SeccompCmpOp::Eq,
                    ArgOp::Ne => seccompiler::SeccompCmpOp::Ne,
                    ArgOp::Lt => seccompiler::SeccompCmpOp::Lt,
                    ArgOp::Le => seccompiler::SeccompCmpOp::Le,
                    ArgOp::Gt => seccompiler::SeccompCmpOp::Gt,
                    ArgOp::Ge => seccompiler::SeccompCmpOp::Ge,
                    ArgOp::MaskedEq(mask) => seccompiler::SeccompCmpOp::MaskedEq(mask),
                };
                conditions.push(
                    seccompiler::SeccompCondition::new(cond.index, width, op, cond.value)
                        .map_err(|e| compile_err(format!("line {}: {e}", rule.line)))?,
                );
            }
            chain.push(
                seccompiler::SeccompRule::new(conditions)
                    .map_err(|e| compile_err(format!("line {}: {e}", rule.line)))?,
            );
        }

        let mut programs = Vec::with_capacity(by_action.len() + 1);
        if arch == "x86_64" {
            programs.push(x32_guard());
        }
        // BTreeMap order: KillProcess first, then errno programs by errno value.
        for (action, syscalls) in by_action {
            let match_action = match action {
                SeccompAction::KillProcess => seccompiler::SeccompAction::KillProcess,
                SeccompAction::Errno(errno) => {
                    // Validated at load time: errno names map to small positive values.
                    seccompiler::SeccompAction::Errno(errno.unsigned_abs())
                }
            };
            let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = syscalls
                .into_iter()
                .map(|(nr, chain)| (nr, chain.unwrap_or_default()))
                .collect();
            let filter = seccompiler::SeccompFilter::new(
                rules,
                seccompiler::SeccompAction::Allow,
                match_action,
                target,
            )
            .map_err(|e| compile_err(e.to_string()))?;
            let bpf: seccompiler::BpfProgram = filter
                .try_into()
                .map_err(|e: seccompiler::BackendError| compile_err(e.to_string()))?;
            programs.push(
                bpf.iter()
                    .map(|i| (i.code, i.jt, i.jf, i.k))
                    .collect::<Vec<_>>(),
            );
        }
        for (index, program) in programs.iter().enumerate() {
            if program.is_empty() || program.len() > BPF_MAX_INSNS {
                return Err(SeccompError::ProgramSize {
                    index,
                    len: program.len(),
                    max: BPF_MAX_INSNS,
                });
            }
        }
        tracing::debug!(
            source = %self.source,
            arch,
            programs = programs.len(),
            instructions = programs.iter().map(Vec::len).sum::<usize>(),
            "seccomp policy compiled"
        );
        Ok(CompiledSeccomp { programs })
    }
}

fn parse_rule(
    ctx: &Ctx<'_>,
    span: Range<usize>,
    raw: RawRule,
) -> Result<SeccompRule, SeccompError> {
    let syscall = raw
        .syscall
        .ok_or_else(|| ctx.err(span.clone(), "syscall", "missing key `syscall`"))?;
    let line = line_of(ctx.text, syscall.span().start);
    if !is_known_syscall(syscall.get_ref()) {
        return Err(ctx.err(
            syscall.span(),
            "syscall",
            format!(
                "unknown syscall `{}` (not in the x86_64 or aarch64 tables)",
                syscall.get_ref()
            ),
        ));
    }
    let why = raw.why.ok_or_else(|| {
        ctx.err(
            span.clone(),
            "why",
            format!("rule for `{}` has no `why`", syscall.get_ref()),
        )
    })?;
    if why.get_ref().trim().is_empty() {
        return Err(ctx.err(why.span(), "why", "`why` must not be empty"));
    }
    let action_name = raw
        .action
        .ok_or_else(|| ctx.err(span.clone(), "action", "missing key `action`"))?;
    let action = match action_name.get_ref().as_str() {
        "errno" => {
            let errno = match &raw.errno {
                None => libc::EPERM,
                Some(name) => ERRNO_NAMES
                    .iter()
                    .find(|(n, _)| *n == name.get_ref())
                    .map(|(_, v)| *v)
                    .ok_or_else(|| {
                        ctx.err(
                            name.span(),
                            "errno",
                            format!("unknown errno name `{}`", name.get_ref()),
                        )
                    })?,
            };
            SeccompAction::Errno(errno)
        }
        "kill_process" => {
            if let Some(errno) = &raw.errno {
                return Err(ctx.err(
                    errno.span(),
                    "errno",
                    "`errno` is only valid with action = \"errno\"",
                ));
            }
            SeccompAction::KillProcess
        }
        other => {
            return Err(ctx.err(
                action_name.span(),
                "action",
                format!("unknown action `{other}` (expected \"errno\" or \"kill_process\")"),
            ))
        }
    };
    let mut args = Vec::new();
    for arg in raw.args.unwrap_or_default() {
        let arg_span = arg.span();
        args.push(parse_arg(ctx, arg_span, arg.into_inner())?);
    }
    Ok(SeccompRule {
        syscall: syscall.into_inner(),
        action,
        args,
        why: why.into_inner(),
        line,
    })
}

fn parse_arg(ctx: &Ctx<'_>, span: Range<usize>, raw: RawArg) -> Result<ArgCondition, SeccompError> {
    let unsigned = |v: &Spanned<i64>, key: &str| {
        u64::try_from(*v.get_ref()).map_err(|_| ctx.err(v.span(), key, "must not be negative"))
    };
    let index = raw
        .index
        .ok_or_else(|| ctx.err(span.clone(), "index", "missing key `index`"))?;
    let index_value = u8::try_from(*index.get_ref())
        .ok()
        .filter(|i| *i <= 5)
        .ok_or_else(|| ctx.err(index.span(), "index", "argument index must be 0..=5"))?;
    let width = match raw.width.as_ref().map(|w| w.get_ref().as_str()) {
        None | Some("qword") => ArgWidth::Qword,
        Some("dword") => ArgWidth::Dword,
        Some(other) => {
            let w_span = raw
                .width
                .as_ref()
                .map(Spanned::span)
                .unwrap_or(span.clone());
            return Err(ctx.err(
                w_span,
                "width",
                format!("unknown width `{other}` (dword or qword)"),
            ));
        }
    };
    let value = raw
        .value
        .ok_or_else(|| ctx.err(span.clone(), "value", "missing key `value`"))?;
    let value_num = unsigned(&value, "value")?;
    let op_name = raw
        .op
        .ok_or_else(|| ctx.err(span.clone(), "op", "missing key `op`"))?;
    let op = match op_name.get_ref().as_str() {
        "eq" => ArgOp::Eq,
        "ne" => ArgOp::Ne,
        "lt" => ArgOp::Lt,
        "le" => ArgOp::Le,
        "gt" => ArgOp::Gt,
        "ge" => ArgOp::Ge,
        "masked_eq" => {
            let mask = raw
                .mask
                .as_ref()
                .ok_or_else(|| ctx.err(op_name.span(), "mask", "op `masked_eq` needs `mask`"))?;
            ArgOp::MaskedEq(unsigned(mask, "mask")?)
        }
        other => {
            return Err(ctx.err(
                op_name.span(),
                "op",
                format!("unknown op `{other}` (eq, ne, lt, le, gt, ge, masked_eq)"),
            ))
        }
    };
    if let (Some(mask), false) = (&raw.mask, matches!(op, ArgOp::MaskedEq(_))) {
        return Err(ctx.err(
            mask.span(),
            "mask",
            "`mask` is only valid with op = \"masked_eq\"",
        ));
    }
    if width == ArgWidth::Dword && value_num > u64::from(u32::MAX) {
        return Err(ctx.err(value.span(), "value", "does not fit a dword comparison"));
    }
    Ok(ArgCondition {
        index: index_value,
        width,
        op,
        value: value_num,
    })
}

// Classic BPF opcodes (linux/bpf_common.h, linux/seccomp.h, linux/audit.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

/// x86_64 guard: the x32 ABI shares AUDIT_ARCH_X86_64 but numbers its syscalls from
/// 0x40000000, which would bypass a deny list keyed on x86_64 numbers: kill them
/// (except nr == -1, which the kernel answers with ENOSYS anyway).
fn x32_guard() -> Vec<(u16, u8, u8, u32)> {
    vec![
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        (BPF_JGE_K, 0, 2, X32_SYSCALL_BIT),
        (BPF_JEQ_K, 1, 0, u32::MAX),
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        (BPF_RET_K, 0, 0, RET_ALLOW),
    ]
}

/// Sets `PR_SET_NO_NEW_PRIVS` (required to install a filter without CAP_SYS_ADMIN, and
/// what makes setuid binaries harmless afterwards). Only a syscall.
fn set_no_new_privs() -> Result<(), SeccompError> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(SeccompError::NoNewPrivs {
            errno: last_errno(),
        });
    }
    Ok(())
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Installs one program on the calling thread. Only a syscall.
fn install(index: usize, program: &[libc::sock_filter]) -> Result<(), SeccompError> {
    let len = u16::try_from(program.len())
        .ok()
        .filter(|l| *l > 0 && usize::from(*l) <= BPF_MAX_INSNS)
        .ok_or(SeccompError::ProgramSize {
            index,
            len: program.len(),
            max: BPF_MAX_INSNS,
        })?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points to `len` valid, initialised `sock_filter`s that outlive the
    // call; the kernel copies the program and does not keep the pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(SeccompError::Install {
            index,
            errno: last_errno(),
        });
    }
    Ok(())
}

impl CompiledSeccomp {
    /// Converts the programs to kernel structures once, so that the forked child only
    /// makes syscalls ([`PreparedSeccomp::apply`]).
    pub fn prepare(&self) -> PreparedSeccomp {
        PreparedSeccomp {
            programs: self
                .programs
                .iter()
                .map(|p| {
                    p.iter()
                        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
                        .collect()
                })
                .collect(),
        }
    }

    /// Sets `PR_SET_NO_NEW_PRIVS`, then installs every program on the calling thread,
    /// in order. Does not allocate: each program is copied into a stack buffer
    /// (`BPF_MAX_INSNS` instructions, 32 KiB). Meant for a forked child right before
    /// `execve`; on error the caller must not exec.
    pub fn apply(&self) -> Result<(), SeccompError> {
        if self.programs.is_empty() {
            return Err(SeccompError::NoPrograms);
        }
        set_no_new_privs()?;
        let mut buffer = [libc::sock_filter {
            code: 0,
            jt: 0,
            jf: 0,
            k: 0,
        }; BPF_MAX_INSNS];
        for (index, program) in self.programs.iter().enumerate() {
            if program.is_empty() || program.len() > BPF_MAX_INSNS {
                return Err(SeccompError::ProgramSize {
                    index,
                    len: program.len(),
                    max: BPF_MAX_INSNS,
                });
            }
            for (slot, &(code, jt, jf, k)) in buffer.iter_mut().zip(program) {
                *slot = libc::sock_filter { code, jt, jf, k };
            }
            install(index, &buffer[..program.len()])?;
        }
        Ok(())
    }
}

impl PreparedSeccomp {
    /// Sets `PR_SET_NO_NEW_PRIVS`, then installs every program on the calling thread.
    /// Only makes syscalls (no allocation): safe in a forked child before `execve`.
    pub fn apply(&self) -> Result<(), SeccompError> {
        if self.programs.is_empty() {
            return Err(SeccompError::NoPrograms);
        }
        set_no_new_privs()?;
        for (index, program) in self.programs.iter().enumerate() {
            install(index, program)?;
        }
        Ok(())
    }

    /// Number of programs.
    pub fn len(&self) -> usize {
        self.programs.len()
    }

    /// True if there is no program (never the case for a compiled policy).
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty()
    }
}

/// x86_64 syscall numbers (from seccompiler 0.5's generated table, Linux 6.12, plus newer ones).
#[rustfmt::skip]
const X86_64_SYSCALLS: &[(&str, i64)] = &[
    ("accept", 43), ("accept4", 288), ("access", 21), ("acct", 163), ("add_key", 248),
    ("adjtimex", 159), ("afs_syscall", 183), ("alarm", 37), ("arch_prctl", 158), ("bind", 49),
    ("bpf", 321), ("brk", 12), ("cachestat", 451), ("capget", 125), ("capset", 126), ("chdir", 80),
    ("chmod", 90), ("chown", 92), ("chroot", 161), ("clock_adjtime", 305), ("clock_getres", 229),
    ("clock_gettime", 228), ("clock_nanosleep", 230), ("clock_settime", 227), ("clone", 56),
    ("clone3", 435), ("close", 3), ("close_range", 436), ("connect", 42), ("copy_file_range", 326),
    ("creat", 85), ("create_module", 174), ("delete_module", 176), ("dup", 32), ("dup2", 33),
    ("dup3", 292), ("epoll_create", 213), ("epoll_create1", 291), ("epoll_ctl", 233),
    ("epoll_ctl_old", 214), ("epoll_pwait", 281), ("epoll_pwait2", 441), ("epoll_wait", 232),
    ("epoll_wait_old", 215), ("eventfd", 284), ("eventfd2", 290), ("execve", 59),
    ("execveat", 322), ("exit", 60), ("exit_group", 231), ("faccessat", 269), ("faccessat2", 439),
    ("fadvise64", 221), ("fallocate", 285), ("fanotify_init", 300), ("fanotify_mark", 301),
    ("fchdir", 81), ("fchmod", 91), ("fchmodat", 268), ("fchmodat2", 452), ("fchown", 93),
    ("fchownat", 260), ("fcntl", 72), ("fdatasync", 75), ("fgetxattr", 193), ("finit_module", 313),
    ("flistxattr", 196), ("flock", 73), ("fork", 57), ("fremovexattr", 199), ("fsconfig", 431),
    ("fsetxattr", 190), ("fsmount", 432), ("fsopen", 430), ("fspick", 433), ("fstat", 5),
    ("fstatfs", 138), ("fsync", 74), ("ftruncate", 77), ("futex", 202), ("futex_requeue", 456),
    ("futex_wait", 455), ("futex_waitv", 449), ("futex_wake", 454), ("futimesat", 261),
    ("getcpu", 309), ("getcwd", 79), ("getdents", 78), ("getdents64", 217), ("getegid", 108),
    ("geteuid", 107), ("getgid", 104), ("getgroups", 115), ("getitimer", 36),
    ("get_kernel_syms", 177), ("get_mempolicy", 239), ("getpeername", 52), ("getpgid", 121),
    ("getpgrp", 111), ("getpid", 39), ("getpmsg", 181), ("getppid", 110), ("getpriority", 140),
    ("getrandom", 318), ("getresgid", 120), ("getresuid", 118), ("getrlimit", 97),
    ("get_robust_list", 274), ("getrusage", 98), ("getsid", 124), ("getsockname", 51),
    ("getsockopt", 55), ("get_thread_area", 211), ("gettid", 186), ("gettimeofday", 96),
    ("getuid", 102), ("getxattr", 191), ("init_module", 175), ("inotify_add_watch", 254),
    ("inotify_init", 253), ("inotify_init1", 294), ("inotify_rm_watch", 255), ("io_cancel", 210),
    ("ioctl", 16), ("io_destroy", 207), ("io_getevents", 208), ("ioperm", 173),
    ("io_pgetevents", 333), ("iopl", 172), ("ioprio_get", 252), ("ioprio_set", 251),
    ("io_setup", 206), ("io_submit", 209), ("io_uring_enter", 426), ("io_uring_register", 427),
    ("io_uring_setup", 425), ("kcmp", 312), ("kexec_file_load", 320), ("kexec_load", 246),
    ("keyctl", 250), ("kill", 62), ("landlock_add_rule", 445), ("landlock_create_ruleset", 444),
    ("landlock_restrict_self", 446), ("lchown", 94), ("lgetxattr", 192), ("link", 86),
    ("linkat", 265), ("listen", 50), ("listmount", 458), ("listxattr", 194), ("llistxattr", 195),
    ("lookup_dcookie", 212), ("lremovexattr", 198), ("lseek", 8), ("lsetxattr", 189),
    ("lsm_get_self_attr", 459), ("lsm_list_modules", 461), ("lsm_set_self_attr", 460),
    ("lstat", 6), ("madvise", 28), ("map_shadow_stack", 453), ("mbind", 237), ("membarrier", 324),
    ("memfd_create", 319), ("memfd_secret", 447), ("migrate_pages", 256), ("mincore", 27),
    ("mkdir", 83), ("mkdirat", 258), ("mknod", 133), ("mknodat", 259), ("mlock", 149),
    ("mlock2", 325), ("mlockall", 151), ("mmap", 9), ("modify_ldt", 154), ("mount", 165),
    ("mount_setattr", 442), ("move_mount", 429), ("move_pages", 279), ("mprotect", 10),
    ("mq_getsetattr", 245), ("mq_notify", 244), ("mq_open", 240), ("mq_timedreceive", 243),
    ("mq_timedsend", 242), ("mq_unlink", 241), ("mremap", 25), ("mseal", 462), ("msgctl", 71),
    ("msgget", 68), ("msgrcv", 70), ("msgsnd", 69), ("msync", 26), ("munlock", 150),
    ("munlockall", 152), ("munmap", 11), ("name_to_handle_at", 303), ("nanosleep", 35),
    ("newfstatat", 262), ("nfsservctl", 180), ("open", 2), ("openat", 257), ("openat2", 437),
    ("open_by_handle_at", 304), ("open_tree", 428), ("pause", 34), ("perf_event_open", 298),
    ("personality", 135), ("pidfd_getfd", 438), ("pidfd_open", 434), ("pidfd_send_signal", 424),
    ("pipe", 22), ("pipe2", 293), ("pivot_root", 155), ("pkey_alloc", 330), ("pkey_free", 331),
    ("pkey_mprotect", 329), ("poll", 7), ("ppoll", 271), ("prctl", 157), ("pread64", 17),
    ("preadv", 295), ("preadv2", 327), ("prlimit64", 302), ("process_madvise", 440),
    ("process_mrelease", 448), ("process_vm_readv", 310), ("process_vm_writev", 311),
    ("pselect6", 270), ("ptrace", 101), ("putpmsg", 182), ("pwrite64", 18), ("pwritev", 296),
    ("pwritev2", 328), ("query_module", 178), ("quotactl", 179), ("quotactl_fd", 443), ("read", 0),
    ("readahead", 187), ("readlink", 89), ("readlinkat", 267), ("readv", 19), ("reboot", 169),
    ("recvfrom", 45), ("recvmmsg", 299), ("recvmsg", 47), ("remap_file_pages", 216),
    ("removexattr", 197), ("rename", 82), ("renameat", 264), ("renameat2", 316),
    ("request_key", 249), ("restart_syscall", 219), ("rmdir", 84), ("rseq", 334),
    ("rt_sigaction", 13), ("rt_sigpending", 127), ("rt_sigprocmask", 14), ("rt_sigqueueinfo", 129),
    ("rt_sigreturn", 15), ("rt_sigsuspend", 130), ("rt_sigtimedwait", 128),
    ("rt_tgsigqueueinfo", 297), ("sched_getaffinity", 204), ("sched_getattr", 315),
    ("sched_getparam", 143), ("sched_get_priority_max", 146), ("sched_get_priority_min", 147),
    ("sched_getscheduler", 145), ("sched_rr_get_interval", 148), ("sched_setaffinity", 203),
    ("sched_setattr", 314), ("sched_setparam", 142), ("sched_setscheduler", 144),
    ("sched_yield", 24), ("seccomp", 317), ("security", 185), ("select", 23), ("semctl", 66),
    ("semget", 64), ("semop", 65), ("semtimedop", 220), ("sendfile", 40), ("sendmmsg", 307),
    ("sendmsg", 46), ("sendto", 44), ("setdomainname", 171), ("setfsgid", 123), ("setfsuid", 122),
    ("setgid", 106), ("setgroups", 116), ("sethostname", 170), ("setitimer", 38),
    ("set_mempolicy", 238), ("set_mempolicy_home_node", 450), ("setns", 308), ("setpgid", 109),
    ("setpriority", 141), ("setregid", 114), ("setresgid", 119), ("setresuid", 117),
    ("setreuid", 113), ("setrlimit", 160), ("set_robust_list", 273), ("setsid", 112),
    ("setsockopt", 54), ("set_thread_area", 205), ("set_tid_address", 218), ("settimeofday", 164),
    ("setuid", 105), ("setxattr", 188), ("shmat", 30), ("shmctl", 31), ("shmdt", 67),
    ("shmget", 29), ("shutdown", 48), ("sigaltstack", 131), ("signalfd", 282), ("signalfd4", 289),
    ("socket", 41), ("socketpair", 53), ("splice", 275), ("stat", 4), ("statfs", 137),
    ("statmount", 457), ("statx", 332), ("swapoff", 168), ("swapon", 167), ("symlink", 88),
    ("symlinkat", 266), ("sync", 162), ("sync_file_range", 277), ("syncfs", 306), ("_sysctl", 156),
    ("sysfs", 139), ("sysinfo", 99), ("syslog", 103), ("tee", 276), ("tgkill", 234), ("time", 201),
    ("timer_create", 222), ("timer_delete", 226), ("timerfd_create", 283),
    ("timerfd_gettime", 287), ("timerfd_settime", 286), ("timer_getoverrun", 225),
    ("timer_gettime", 224), ("timer_settime", 223), ("times", 100), ("tkill", 200),
    ("truncate", 76), ("tuxcall", 184), ("umask", 95), ("umount2", 166), ("uname", 63),
    ("unlink", 87), ("unlinkat", 263), ("unshare", 272), ("uretprobe", 335), ("uselib", 134),
    ("userfaultfd", 323), ("ustat", 136), ("utime", 132), ("utimensat", 280), ("utimes", 235),
    ("vfork", 58), ("vhangup", 153), ("vmsplice", 278), ("vserver", 236), ("wait4", 61),
    ("waitid", 247), ("write", 1), ("writev", 20),
    // Added after seccompiler's 6.12 tables (asm-generic numbers, same on both arches):
    ("setxattrat", 463), ("getxattrat", 464), ("listxattrat", 465), ("removexattrat", 466),
    ("open_tree_attr", 467), ("file_getattr", 468), ("file_setattr", 469),
];

/// aarch64 syscall numbers (from seccompiler 0.5's generated table, Linux 6.12, plus newer ones).
#[rustfmt::skip]
const AARCH64_SYSCALLS: &[(&str, i64)] = &[
    ("accept", 202), ("accept4", 242), ("acct", 89), ("add_key", 217), ("adjtimex", 171),
    ("bind", 200), ("bpf", 280), ("brk", 214), ("cachestat", 451), ("capget", 90), ("capset", 91),
    ("chdir", 49), ("chroot", 51), ("clock_adjtime", 266), ("clock_getres", 114),
    ("clock_gettime", 113), ("clock_nanosleep", 115), ("clock_settime", 112), ("clone", 220),
    ("clone3", 435), ("close", 57), ("close_range", 436), ("connect", 203),
    ("copy_file_range", 285), ("delete_module", 106), ("dup", 23), ("dup3", 24),
    ("epoll_create1", 20), ("epoll_ctl", 21), ("epoll_pwait", 22), ("epoll_pwait2", 441),
    ("eventfd2", 19), ("execve", 221), ("execveat", 281), ("exit", 93), ("exit_group", 94),
    ("faccessat", 48), ("faccessat2", 439), ("fadvise64", 223), ("fallocate", 47),
    ("fanotify_init", 262), ("fanotify_mark", 263), ("fchdir", 50), ("fchmod", 52),
    ("fchmodat", 53), ("fchmodat2", 452), ("fchown", 55), ("fchownat", 54), ("fcntl", 25),
    ("fdatasync", 83), ("fgetxattr", 10), ("finit_module", 273), ("flistxattr", 13), ("flock", 32),
    ("fremovexattr", 16), ("fsconfig", 431), ("fsetxattr", 7), ("fsmount", 432), ("fsopen", 430),
    ("fspick", 433), ("fstat", 80), ("fstatfs", 44), ("fsync", 82), ("ftruncate", 46),
    ("futex", 98), ("futex_requeue", 456), ("futex_wait", 455), ("futex_waitv", 449),
    ("futex_wake", 454), ("getcpu", 168), ("getcwd", 17), ("getdents64", 61), ("getegid", 177),
    ("geteuid", 175), ("getgid", 176), ("getgroups", 158), ("getitimer", 102),
    ("get_mempolicy", 236), ("getpeername", 205), ("getpgid", 155), ("getpid", 172),
    ("getppid", 173), ("getpriority", 141), ("getrandom", 278), ("getresgid", 150),
    ("getresuid", 148), ("getrlimit", 163), ("get_robust_list", 100), ("getrusage", 165),
    ("getsid", 156), ("getsockname", 204), ("getsockopt", 209), ("gettid", 178),
    ("gettimeofday", 169), ("getuid", 174), ("getxattr", 8), ("init_module", 105),
    ("inotify_add_watch", 27), ("inotify_init1", 26), ("inotify_rm_watch", 28), ("io_cancel", 3),
    ("ioctl", 29), ("io_destroy", 1), ("io_getevents", 4), ("io_pgetevents", 292),
    ("ioprio_get", 31), ("ioprio_set", 30), ("io_setup", 0), ("io_submit", 2),
    ("io_uring_enter", 426), ("io_uring_register", 427), ("io_uring_setup", 425), ("kcmp", 272),
    ("kexec_file_load", 294), ("kexec_load", 104), ("keyctl", 219), ("kill", 129),
    ("landlock_add_rule", 445), ("landlock_create_ruleset", 444), ("landlock_restrict_self", 446),
    ("lgetxattr", 9), ("linkat", 37), ("listen", 201), ("listmount", 458), ("listxattr", 11),
    ("llistxattr", 12), ("lookup_dcookie", 18), ("lremovexattr", 15), ("lseek", 62),
    ("lsetxattr", 6), ("lsm_get_self_attr", 459), ("lsm_list_modules", 461),
    ("lsm_set_self_attr", 460), ("madvise", 233), ("map_shadow_stack", 453), ("mbind", 235),
    ("membarrier", 283), ("memfd_create", 279), ("memfd_secret", 447), ("migrate_pages", 238),
    ("mincore", 232), ("mkdirat", 34), ("mknodat", 33), ("mlock", 228), ("mlock2", 284),
    ("mlockall", 230), ("mmap", 222), ("mount", 40), ("mount_setattr", 442), ("move_mount", 429),
    ("move_pages", 239), ("mprotect", 226), ("mq_getsetattr", 185), ("mq_notify", 184),
    ("mq_open", 180), ("mq_timedreceive", 183), ("mq_timedsend", 182), ("mq_unlink", 181),
    ("mremap", 216), ("mseal", 462), ("msgctl", 187), ("msgget", 186), ("msgrcv", 188),
    ("msgsnd", 189), ("msync", 227), ("munlock", 229), ("munlockall", 231), ("munmap", 215),
    ("name_to_handle_at", 264), ("nanosleep", 101), ("newfstatat", 79), ("nfsservctl", 42),
    ("openat", 56), ("openat2", 437), ("open_by_handle_at", 265), ("open_tree", 428),
    ("perf_event_open", 241), ("personality", 92), ("pidfd_getfd", 438), ("pidfd_open", 434),
    ("pidfd_send_signal", 424), ("pipe2", 59), ("pivot_root", 41), ("pkey_alloc", 289),
    ("pkey_free", 290), ("pkey_mprotect", 288), ("ppoll", 73), ("prctl", 167), ("pread64", 67),
    ("preadv", 69), ("preadv2", 286), ("prlimit64", 261), ("process_madvise", 440),
    ("process_mrelease", 448), ("process_vm_readv", 270), ("process_vm_writev", 271),
    ("pselect6", 72), ("ptrace", 117), ("pwrite64", 68), ("pwritev", 70), ("pwritev2", 287),
    ("quotactl", 60), ("quotactl_fd", 443), ("read", 63), ("readahead", 213), ("readlinkat", 78),
    ("readv", 65), ("reboot", 142), ("recvfrom", 207), ("recvmmsg", 243), ("recvmsg", 212),
    ("remap_file_pages", 234), ("removexattr", 14), ("renameat", 38), ("renameat2", 276),
    ("request_key", 218), ("restart_syscall", 128), ("rseq", 293), ("rt_sigaction", 134),
    ("rt_sigpending", 136), ("rt_sigprocmask", 135), ("rt_sigqueueinfo", 138),
    ("rt_sigreturn", 139), ("rt_sigsuspend", 133), ("rt_sigtimedwait", 137),
    ("rt_tgsigqueueinfo", 240), ("sched_getaffinity", 123), ("sched_getattr", 275),
    ("sched_getparam", 121), ("sched_get_priority_max", 125), ("sched_get_priority_min", 126),
    ("sched_getscheduler", 120), ("sched_rr_get_interval", 127), ("sched_setaffinity", 122),
    ("sched_setattr", 274), ("sched_setparam", 118), ("sched_setscheduler", 119),
    ("sched_yield", 124), ("seccomp", 277), ("semctl", 191), ("semget", 190), ("semop", 193),
    ("semtimedop", 192), ("sendfile", 71), ("sendmmsg", 269), ("sendmsg", 211), ("sendto", 206),
    ("setdomainname", 162), ("setfsgid", 152), ("setfsuid", 151), ("setgid", 144),
    ("setgroups", 159), ("sethostname", 161), ("setitimer", 103), ("set_mempolicy", 237),
    ("set_mempolicy_home_node", 450), ("setns", 268), ("setpgid", 154), ("setpriority", 140),
    ("setregid", 143), ("setresgid", 149), ("setresuid", 147), ("setreuid", 145),
    ("setrlimit", 164), ("set_robust_list", 99), ("setsid", 157), ("setsockopt", 208),
    ("set_tid_address", 96), ("settimeofday", 170), ("setuid", 146), ("setxattr", 5),
    ("shmat", 196), ("shmctl", 195), ("shmdt", 197), ("shmget", 194), ("shutdown", 210),
    ("sigaltstack", 132), ("signalfd4", 74), ("socket", 198), ("socketpair", 199), ("splice", 76),
    ("statfs", 43), ("statmount", 457), ("statx", 291), ("swapoff", 225), ("swapon", 224),
    ("symlinkat", 36), ("sync", 81), ("sync_file_range", 84), ("syncfs", 267), ("sysinfo", 179),
    ("syslog", 116), ("tee", 77), ("tgkill", 131), ("timer_create", 107), ("timer_delete", 111),
    ("timerfd_create", 85), ("timerfd_gettime", 87), ("timerfd_settime", 86),
    ("timer_getoverrun", 109), ("timer_gettime", 108), ("timer_settime", 110), ("times", 153),
    ("tkill", 130), ("truncate", 45), ("umask", 166), ("umount2", 39), ("uname", 160),
    ("unlinkat", 35), ("unshare", 97), ("userfaultfd", 282), ("utimensat", 88), ("vhangup", 58),
    ("vmsplice", 75), ("wait4", 260), ("waitid", 95), ("write", 64), ("writev", 66),
    // Added after seccompiler's 6.12 tables (asm-generic numbers, same on both arches):
    ("setxattrat", 463), ("getxattrat", 464), ("listxattrat", 465), ("removexattrat", 466),
    ("open_tree_attr", 467), ("file_getattr", 468), ("file_setattr", 469),
];

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    use std::ffi::CString;

    /// Exit code of a child whose attack unexpectedly succeeded.
    const SUCCEEDED: i32 = 0;
    /// Exit code of a child whose filter could not be installed.
    const APPLY_FAILED: i32 = 200;

    fn errno() -> i32 {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(255)
    }

    /// Forks; the child installs `compiled`, runs `attack` and exits with its result
    /// (an errno, or 0 if the syscall succeeded). The test process is never filtered.
    fn run_filtered(compiled: &CompiledSeccomp, attack: impl FnOnce() -> i32) -> WaitStatus {
        let prepared = compiled.prepare();
        // SAFETY: the child only installs the filter, runs `attack` (raw syscalls and,
        // for the thread test, thread creation) and leaves with `_exit`.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = match prepared.apply() {
                    Ok(()) => attack(),
                    Err(_) => APPLY_FAILED,
                };
                // SAFETY: `_exit` ends the child without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => waitpid(child, None).expect("waitpid"),
        }
    }

    fn embedded_compiled() -> CompiledSeccomp {
        SeccompPolicy::embedded()
            .expect("embedded policy parses")
            .compile()
            .expect("embedded policy compiles")
    }

    fn assert_exit(status: WaitStatus, expected: i32, what: &str) {
        match status {
            WaitStatus::Exited(_, code) => assert_eq!(code, expected, "{what}: exit code"),
            other => panic!("{what}: unexpected status {other:?}"),
        }
    }

    /// Result of a raw syscall: 0 on success, else errno.
    fn result_of(rc: libc::c_long) -> i32 {
        if rc < 0 {
            errno()
        } else {
            SUCCEEDED
        }
    }

    fn policy_err(text: &str) -> (usize, String, String) {
        match SeccompPolicy::from_toml(text, "test.toml") {
            Err(SeccompError::Policy {
                file,
                line,
                key,
                reason,
            }) => {
                assert_eq!(file, "test.toml");
                (line, key, reason)
            }
            other => panic!("expected a policy error, got {other:?}"),
        }
    }

    #[test]
    fn embedded_policy_parses_and_every_rule_has_a_why() {
        let policy = SeccompPolicy::embedded().unwrap();
        assert!(!policy.rules().is_empty());
        for rule in policy.rules() {
            assert!(
                !rule.why.trim().is_empty(),
                "{} has an empty why",
                rule.syscall
            );
        }
        let names: Vec<&str> = policy.rules().iter().map(|r| r.syscall.as_str()).collect();
        for required in [
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "bpf",
            "perf_event_open",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "kcmp",
            "keyctl",
            "add_key",
            "request_key",
            "reboot",
            "swapon",
            "swapoff",
            "clock_settime",
            "clock_adjtime",
            "settimeofday",
            "adjtimex",
            "setns",
            "unshare",
            "clone",
            "clone3",
            "userfaultfd",
            "open_by_handle_at",
            "name_to_handle_at",
            "iopl",
            "ioperm",
            "acct",
            "quotactl",
            "lookup_dcookie",
            "nfsservctl",
            "personality",
            "syslog",
            "vhangup",
            "uselib",
            "ustat",
            "sysfs",
            "_sysctl",
            "pidfd_getfd",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "fanotify_init",
        ] {
            assert!(names.contains(&required), "policy lacks {required}");
        }
        let clone3 = policy
            .rules()
            .iter()
            .find(|r| r.syscall == "clone3")
            .unwrap();
        assert_eq!(clone3.action, SeccompAction::Errno(libc::ENOSYS));
        let clone_rules = policy
            .rules()
            .iter()
            .filter(|r| r.syscall == "clone")
            .count();
        assert_eq!(clone_rules, 7, "one clone rule per CLONE_NEW* flag");
    }

    #[test]
    fn every_rule_has_a_comment_line_above() {
        let lines: Vec<&str> = EMBEDDED_POLICY.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() == "[[rule]]" {
                assert!(
                    i > 0 && lines[i - 1].trim_start().starts_with('#'),
                    "line {}",
                    i + 1
                );
            }
        }
    }

    #[test]
    fn table_matches_libc_on_this_arch() {
        let arch = std::env::consts::ARCH;
        for (name, nr) in [
            ("mount", libc::SYS_mount),
            ("clone", libc::SYS_clone),
            ("clone3", libc::SYS_clone3),
            ("bpf", libc::SYS_bpf),
            ("keyctl", libc::SYS_keyctl),
            ("mseal", libc::SYS_mseal),
            ("io_uring_setup", libc::SYS_io_uring_setup),
        ] {
            assert_eq!(syscall_nr(arch, name), Some(nr), "{name}");
        }
    }

    #[test]
    fn unknown_syscall_is_an_error_with_line_and_key() {
        let text = "# c\n[[rule]]\nsyscall = \"mount\"\naction = \"errno\"\nwhy = \"x\"\n\n# c\n[[rule]]\nsyscall = \"no_such_call\"\naction = \"errno\"\nwhy = \"x\"\n";
        let (line, key, reason) = policy_err(text);
        assert_eq!((line, key.as_str()), (9, "syscall"));
        assert!(reason.contains("no_such_call"), "{reason}");
    }

    #[test]
    fn missing_why_is_an_error_with_line_and_key() {
        let text = "[[rule]]\nsyscall = \"mount\"\naction = \"errno\"\nwhy = \"x\"\n\n[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\n";
        let (line, key, reason) = policy_err(text);
        assert_eq!(key, "why");
        assert!((6..=8).contains(&line), "line {line}: {reason}");
        let (_, key, _) =
            policy_err("[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\nwhy = \"  \"\n");
        assert_eq!(key, "why");
    }

    #[test]
    fn bad_action_and_errno_are_errors() {
        let (line, key, reason) =
            policy_err("[[rule]]\nsyscall = \"bpf\"\naction = \"trap\"\nwhy = \"x\"\n");
        assert_eq!((line, key.as_str()), (3, "action"), "{reason}");
        let (line, key, _) = policy_err(
            "[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\nerrno = \"EWHAT\"\nwhy = \"x\"\n",
        );
        assert_eq!((line, key.as_str()), (4, "errno"));
        let (_, key, _) = policy_err(
            "[[rule]]\nsyscall = \"bpf\"\naction = \"kill_process\"\nerrno = \"EPERM\"\nwhy = \"x\"\n",
        );
        assert_eq!(key, "errno");
        let (line, key, _) = policy_err(
            "[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\nwhy = \"x\"\ncolour = \"red\"\n",
        );
        assert_eq!((line, key.as_str()), (5, "colour"));
        let (_, key, _) = policy_err("");
        assert_eq!(key, "rule");
        let (line, key, _) = policy_err("# ok\n[[rule]\n");
        assert_eq!((line, key.as_str()), (2, "(syntax)"));
    }

    #[test]
    fn conflicting_errnos_are_rejected() {
        let text = "[[rule]]\nsyscall = \"clone\"\naction = \"errno\"\nwhy = \"x\"\n[[rule]]\nsyscall = \"clone\"\naction = \"errno\"\nerrno = \"ENOSYS\"\nwhy = \"y\"\n";
        let (line, key, _) = policy_err(text);
        assert_eq!((line, key.as_str()), (6, "errno"));
    }

    #[test]
    fn bad_argument_conditions_are_errors() {
        let (_, key, _) = policy_err(
            "[[rule]]\nsyscall = \"clone\"\nargs = [{ index = 6, op = \"eq\", value = 1 }]\naction = \"errno\"\nwhy = \"x\"\n",
        );
        assert_eq!(key, "index");
        let (_, key, _) = policy_err(
            "[[rule]]\nsyscall = \"clone\"\nargs = [{ index = 0, op = \"masked_eq\", value = 1 }]\naction = \"errno\"\nwhy = \"x\"\n",
        );
        assert_eq!(key, "mask");
        let (_, key, _) = policy_err(
            "[[rule]]\nsyscall = \"clone\"\nargs = [{ index = 0, op = \"like\", value = 1 }]\naction = \"errno\"\nwhy = \"x\"\n",
        );
        assert_eq!(key, "op");
    }

    #[test]
    fn compile_produces_programs_for_both_arches() {
        let policy = SeccompPolicy::embedded().unwrap();
        let x86 = policy.compile_for("x86_64").unwrap();
        // x32 guard + kill_process + EPERM + ENOSYS.
        assert_eq!(x86.programs.len(), 4);
        let arm = policy.compile_for("aarch64").unwrap();
        assert_eq!(arm.programs.len(), 3);
        for program in x86.programs.iter().chain(&arm.programs) {
            assert!(!program.is_empty() && program.len() <= BPF_MAX_INSNS);
            // Every program starts with the architecture check.
            assert_eq!(program[0], (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH));
        }
        assert!(matches!(
            policy.compile_for("mips"),
            Err(SeccompError::UnsupportedArch { .. })
        ));
        let empty = CompiledSeccomp { programs: vec![] };
        assert!(matches!(empty.apply(), Err(SeccompError::NoPrograms)));
        assert!(matches!(
            empty.prepare().apply(),
            Err(SeccompError::NoPrograms)
        ));
        let json = serde_json::to_string(&x86).unwrap();
        let back: CompiledSeccomp = serde_json::from_str(&json).unwrap();
        assert_eq!(back, x86);
    }

    #[test]
    fn mount_is_eperm() {
        let compiled = embedded_compiled();
        let status = run_filtered(&compiled, || {
            // Without the filter this fails with ENOENT (no such target), never mounts.
            // SAFETY: valid NUL-terminated strings and a null data pointer.
            let rc = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    c"/nonexistent-envfactory-target".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            result_of(rc.into())
        });
        assert_exit(status, libc::EPERM, "mount");
    }

    #[test]
    fn unshare_newuser_is_eperm() {
        let compiled = embedded_compiled();
        let status = run_filtered(&compiled, || {
            raw(
                libc::SYS_unshare,
                [libc::c_long::from(libc::CLONE_NEWUSER), 0, 0, 0],
            )
        });
        assert_exit(status, libc::EPERM, "unshare(CLONE_NEWUSER)");
    }

    /// Raw syscall for the attack tests: 0 on success, else errno. Callers pass
    /// integers, null pointers or pointers to static NUL-terminated strings.
    fn raw(nr: libc::c_long, args: [libc::c_long; 4]) -> i32 {
        // SAFETY: see above; the kernel validates every pointer it is given.
        result_of(unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3]) })
    }

    /// Raw clone(2) with `flags` and no new stack (fork semantics).
    fn raw_clone(flags: libc::c_long) -> i32 {
        // SAFETY: clone without CLONE_VM and with a null stack behaves like fork; the
        // grandchild leaves immediately with `_exit`.
        let rc = unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
        if rc == 0 {
            // SAFETY: leave the grandchild at once.
            unsafe { libc::_exit(0) }
        }
        if rc > 0 {
            let _ = waitpid(nix::unistd::Pid::from_raw(rc as i32), None);
            return SUCCEEDED;
        }
        errno()
    }

    #[test]
    fn clone_newns_is_eperm_and_plain_fork_works() {
        let compiled = embedded_compiled();
        let flags = libc::c_long::from(libc::CLONE_NEWNS | libc::SIGCHLD);
        let status = run_filtered(&compiled, || raw_clone(flags));
        assert_exit(status, libc::EPERM, "clone(CLONE_NEWNS)");
        let status = run_filtered(&compiled, || raw_clone(libc::c_long::from(libc::SIGCHLD)));
        assert_exit(status, SUCCEEDED, "clone(SIGCHLD)");
        let status = run_filtered(&compiled, || {
            // SAFETY: plain fork; the grandchild exits at once with a known code.
            match unsafe { libc::fork() } {
                // SAFETY: leave the grandchild at once.
                0 => unsafe { libc::_exit(7) },
                -1 => errno(),
                pid => match waitpid(nix::unistd::Pid::from_raw(pid), None) {
                    Ok(WaitStatus::Exited(_, 7)) => SUCCEEDED,
                    _ => 101,
                },
            }
        });
        assert_exit(status, SUCCEEDED, "fork");
    }

    #[test]
    fn clone3_is_enosys_and_threads_work() {
        let compiled = embedded_compiled();
        let status = run_filtered(&compiled, || {
            // struct clone_args, 88 bytes (CLONE_ARGS_SIZE_VER2); exit_signal = SIGCHLD.
            let mut args = [0u64; 11];
            args[4] = libc::SIGCHLD as u64;
            // SAFETY: `args` is a valid clone_args of the size passed; if the call
            // succeeded the grandchild would leave at once.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    args.as_mut_ptr(),
                    std::mem::size_of_val(&args),
                )
            };
            if rc == 0 {
                // SAFETY: leave the grandchild at once.
                unsafe { libc::_exit(0) }
            }
            result_of(rc)
        });
        assert_exit(status, libc::ENOSYS, "clone3");
        let status = run_filtered(&compiled, || match std::thread::spawn(|| 42).join() {
            Ok(42) => SUCCEEDED,
            _ => 102,
        });
        assert_exit(status, SUCCEEDED, "std::thread::spawn");
    }

    #[test]
    fn ptrace_keyctl_reboot_bpf_init_module_are_eperm() {
        let compiled = embedded_compiled();
        let status = run_filtered(&compiled, || {
            raw(
                libc::SYS_ptrace,
                [libc::c_long::from(libc::PTRACE_TRACEME), 0, 0, 0],
            )
        });
        assert_exit(status, libc::EPERM, "ptrace(PTRACE_TRACEME)");
        // KEYCTL_GET_KEYRING_ID (0) of KEY_SPEC_SESSION_KEYRING (-3), no create.
        let status = run_filtered(&compiled, || raw(libc::SYS_keyctl, [0, -3, 0, 0]));
        assert_exit(status, libc::EPERM, "keyctl");
        // Bad magic numbers: without the filter, EINVAL (never reboots).
        let status = run_filtered(&compiled, || raw(libc::SYS_reboot, [0, 0, 0, 0]));
        assert_exit(status, libc::EPERM, "reboot");
        // BPF_MAP_CREATE with a null attr: without the filter, EINVAL/EFAULT.
        let status = run_filtered(&compiled, || raw(libc::SYS_bpf, [0, 0, 0, 0]));
        assert_exit(status, libc::EPERM, "bpf");
        // Null image: without the filter, EFAULT/ENOEXEC (never loads anything).
        let status = run_filtered(&compiled, || {
            raw(
                libc::SYS_init_module,
                [0, 0, c"".as_ptr() as libc::c_long, 0],
            )
        });
        assert_exit(status, libc::EPERM, "init_module");
    }

    #[test]
    fn kill_process_action_kills_with_sigsys() {
        let policy = SeccompPolicy::from_toml(
            "# test\n[[rule]]\nsyscall = \"getppid\"\naction = \"kill_process\"\nwhy = \"test\"\n",
            "kill.toml",
        )
        .unwrap();
        let compiled = policy.compile().unwrap();
        let status = run_filtered(&compiled, || raw(libc::SYS_getppid, [0, 0, 0, 0]));
        assert!(
            matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
            "{status:?}"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_syscall_numbers_are_killed() {
        let compiled = embedded_compiled();
        // x32 getpid: 0x40000000 | 39.
        let status = run_filtered(&compiled, || {
            raw(0x4000_0000 | libc::SYS_getpid, [0, 0, 0, 0])
        });
        assert!(
            matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
            "{status:?}"
        );
    }

    /// i386 `getpid` through `int 0x80` (audit arch AUDIT_ARCH_I386).
    #[cfg(target_arch = "x86_64")]
    fn int80_getpid() -> i32 {
        let mut eax: u32 = 20;
        // SAFETY: the 32-bit getpid syscall takes no arguments and touches no memory;
        // the registers the kernel may clobber are declared.
        unsafe {
            std::arch::asm!(
                "int 0x80",
                inout("eax") eax,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                options(nostack)
            );
        }
        i32::from(eax == 0)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn foreign_architecture_syscalls_are_killed() {
        // Unfiltered: the kernel must support the i386 ABI, else there is nothing to test.
        // SAFETY: the child makes one syscall and leaves with `_exit`.
        let unfiltered = match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = int80_getpid();
                // SAFETY: leave the child.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => waitpid(child, None).expect("waitpid"),
        };
        if !matches!(unfiltered, WaitStatus::Exited(_, 0)) {
            eprintln!("no i386 syscall ABI here ({unfiltered:?}); skipped");
            return;
        }
        let status = run_filtered(&embedded_compiled(), int80_getpid);
        assert!(
            matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
            "{status:?}"
        );
    }

    fn exec_sh(script: &str) -> (WaitStatus, String) {
        let compiled = embedded_compiled();
        let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
        let sh = CString::new("/bin/sh").unwrap();
        let argv = [
            CString::new("sh").unwrap(),
            CString::new("-c").unwrap(),
            CString::new(script).unwrap(),
        ];
        let prepared = compiled.prepare();
        // SAFETY: the child only redirects stdout, installs the filter and execs.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                drop(read_end);
                // SAFETY: dup2 of a valid descriptor onto stdout.
                unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&write_end), 1) };
                if prepared.apply().is_err() {
                    // SAFETY: leave the child.
                    unsafe { libc::_exit(APPLY_FAILED) }
                }
                let _ = nix::unistd::execv(&sh, &argv);
                // SAFETY: leave the child if exec failed.
                unsafe { libc::_exit(127) }
            }
            ForkResult::Parent { child } => {
                drop(write_end);
                let mut out = String::new();
                let mut file = std::fs::File::from(read_end);
                std::io::Read::read_to_string(&mut file, &mut out).expect("read");
                (waitpid(child, None).expect("waitpid"), out)
            }
        }
    }

    #[test]
    fn exec_sh_true_works_after_filter() {
        let (status, _) = exec_sh("true");
        assert_exit(status, 0, "sh -c true");
    }

    #[test]
    fn shell_pipeline_works_after_filter() {
        let (status, out) = exec_sh("echo hi | cat");
        assert_exit(status, 0, "sh -c 'echo hi | cat'");
        assert_eq!(out, "hi\n");
    }
}
