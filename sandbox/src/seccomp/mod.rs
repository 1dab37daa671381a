//! Seccomp policy as data: a deny list with default allow, read from
//! `sandbox/policy/seccomp.toml` (embedded at build time) and compiled to classic BPF.
//!
//! Life cycle in the resident init (PID 1):
//! 1. [`SeccompPolicy::embedded`] parses and validates the file once (fail closed: an
//!    unknown syscall name, a missing `why`, a bad action or errno is an error naming the
//!    file, line and key);
//! 2. [`SeccompPolicy::compile`] builds one BPF program for the running architecture
//!    ([`bpf`]: the architecture check, on x86_64 a guard that kills x32-ABI syscalls, then
//!    a binary search over the denied syscall numbers);
//! 3. [`CompiledSeccomp::prepare`] converts it to `libc::sock_filter` buffers;
//! 4. after each `fork`, the child calls [`PreparedSeccomp::apply`] (or
//!    [`CompiledSeccomp::apply`]) right before `execve`; neither allocates.
//!
//! The architecture check returns `SECCOMP_RET_KILL_PROCESS` for any other audit
//! architecture (e.g. i386 syscalls made through `int 0x80` on x86_64).
//!
//! Precedence: within a syscall, `kill_process` rules come before `errno` rules, as the
//! kernel would rank the results of separate programs (`KILL_PROCESS` > `ERRNO` > `ALLOW`).
//! The loader rejects a syscall listed with two different errno values, so no order between
//! errno rules decides anything. The tests check the program's decision for every syscall
//! number against one linear program per action, compiled with `seccompiler`.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

pub mod bpf;
mod syscalls;
use syscalls::{is_known_syscall, syscall_nr};

/// Text of the embedded default policy.
pub const EMBEDDED_POLICY: &str = include_str!("../../policy/seccomp.toml");
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

use crate::text_pos::{line_of, quoted_key};

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

    /// Compiles the policy for `arch` (`"x86_64"` or `"aarch64"`) into one program (see
    /// [`bpf`]). Rules naming a syscall that `arch` does not have are skipped (it cannot be
    /// called there).
    pub fn compile_for(&self, arch: &str) -> Result<CompiledSeccomp, SeccompError> {
        let (audit, x32) = match arch {
            "x86_64" => (bpf::AUDIT_ARCH_X86_64, true),
            "aarch64" => (bpf::AUDIT_ARCH_AARCH64, false),
            _ => {
                return Err(SeccompError::UnsupportedArch {
                    arch: arch.to_string(),
                })
            }
        };
        let mut by_nr: BTreeMap<u32, bpf::NrRules> = BTreeMap::new();
        for rule in &self.rules {
            let Some(nr) = syscall_nr(arch, &rule.syscall) else {
                tracing::debug!(syscall = %rule.syscall, arch, line = rule.line, "syscall absent on this architecture; rule skipped");
                continue;
            };
            let nr = u32::try_from(nr).map_err(|_| SeccompError::Compile {
                file: self.source.clone(),
                arch: arch.to_string(),
                reason: format!("line {}: syscall number {nr} out of range", rule.line),
            })?;
            by_nr
                .entry(nr)
                .or_default()
                .push((rule.action, rule.args.clone()));
        }
        let program = bpf::program(audit, x32, &by_nr).map_err(|reason| SeccompError::Compile {
            file: self.source.clone(),
            arch: arch.to_string(),
            reason,
        })?;
        if program.len() > BPF_MAX_INSNS {
            return Err(SeccompError::ProgramSize {
                index: 0,
                len: program.len(),
                max: BPF_MAX_INSNS,
            });
        }
        tracing::debug!(
            source = %self.source,
            arch,
            syscalls = by_nr.len(),
            instructions = program.len(),
            "seccomp policy compiled"
        );
        Ok(CompiledSeccomp {
            programs: vec![program],
        })
    }
}

/// What the compiled embedded policy depends on: the architecture, the policy text and the
/// compiler's own sources (a changed compiler never reuses an old program).
fn embedded_key(arch: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for part in [
        arch,
        EMBEDDED_POLICY,
        include_str!("mod.rs"),
        include_str!("bpf.rs"),
        include_str!("syscalls.rs"),
    ] {
        h.update(part.len().to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The embedded policy compiled for the running architecture, remembered in `cache_dir`
/// under the digest of the policy and of this compiler ([`crate::digest_cache`]), so that a
/// new process does not parse the TOML again. An entry that does not read back as a valid
/// program is ignored and replaced.
pub fn embedded_compiled(cache_dir: &std::path::Path) -> Result<CompiledSeccomp, SeccompError> {
    let arch = std::env::consts::ARCH;
    let key = embedded_key(arch);
    let name = format!("seccomp-{arch}.json");
    let cached = crate::digest_cache::read(cache_dir, &name, &key)
        .and_then(|bytes| serde_json::from_slice::<CompiledSeccomp>(&bytes).ok())
        .filter(CompiledSeccomp::well_formed);
    if let Some(c) = cached {
        return Ok(c);
    }
    let c = SeccompPolicy::embedded()?.compile()?;
    if let Ok(json) = serde_json::to_vec(&c) {
        crate::digest_cache::write(cache_dir, &name, &key, &json);
    }
    Ok(c)
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
    /// At least one program, each of a length the kernel accepts.
    pub fn well_formed(&self) -> bool {
        !self.programs.is_empty()
            && self
                .programs
                .iter()
                .all(|p| !p.is_empty() && p.len() <= BPF_MAX_INSNS)
    }

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

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod tests;
