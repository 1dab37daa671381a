//! Landlock policy as data: filesystem rules and IPC scopes read from
//! `sandbox/policy/landlock.toml` (embedded at build time).
//!
//! Life cycle in the resident init (PID 1):
//! 1. [`LandlockPolicy::embedded`] parses and validates the file once (fail closed:
//!    unknown keys or rights, a relative path, a missing `why` are errors naming the
//!    file, line and key);
//! 2. [`LandlockPolicy::prepare`] opens each rule's path beneath the sandbox root (as
//!    seen by init, before `chroot`) and builds a landlock ruleset: once per
//!    (re)mounted root. **A prepared ruleset refers to the inodes that existed when it
//!    was built: rebuild it after the root (or /proc, /dev, ...) is remounted or reset**,
//!    otherwise its rules point at the old mounts and the agent gets no access at all
//!    to the new ones (fail closed, but broken);
//! 3. after each `fork`, the child calls [`PreparedLandlock::enforce`] on its copy (use
//!    [`PreparedLandlock::try_clone`] first when the parent keeps its own for the next
//!    fork: it only `dup`s the ruleset descriptor). `enforce` also sets
//!    `PR_SET_NO_NEW_PRIVS`.
//!
//! Enforcement is best effort per kernel ABI: [`LandlockStatus`] says whether the
//! ruleset was fully or partially enforced, or not at all (kernel without landlock);
//! the caller decides whether to refuse to start.

use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ::landlock::{
    Access, AccessFs, BitFlags, PathBeneath, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use serde::Deserialize;
use toml::Spanned;

/// Text of the embedded default policy.
pub const EMBEDDED_POLICY: &str = include_str!("../policy/landlock.toml");
/// Name used for the embedded policy in error messages.
pub const EMBEDDED_SOURCE: &str = "sandbox/policy/landlock.toml";

/// Highest landlock ABI a policy file may declare (known to the `landlock` crate).
pub const MAX_POLICY_ABI: i64 = 6;

/// Errors of loading, preparing or enforcing a landlock policy.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The policy text is invalid.
    #[error("{file}:{line}: key `{key}`: {reason}")]
    Policy {
        /// Source name given to [`LandlockPolicy::from_toml`].
        file: String,
        /// 1-based line of the offending item.
        line: usize,
        /// The offending key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A rule's path exists beneath the root but could not be opened.
    #[error("cannot open `{path}` beneath sandbox root `{root}` (rule at line {line}): {source}")]
    Open {
        /// The sandbox root.
        root: PathBuf,
        /// The rule's path inside the root.
        path: String,
        /// Line of the rule.
        line: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// The landlock crate refused to build the ruleset.
    #[error("building the landlock ruleset ({step}): {source}")]
    Ruleset {
        /// What was being done.
        step: String,
        /// The crate's error.
        source: ::landlock::RulesetError,
    },
    /// `landlock_restrict_self` (or `PR_SET_NO_NEW_PRIVS`) failed in the child.
    #[error("enforcing the landlock ruleset: {source}")]
    Enforce {
        /// The crate's error.
        source: ::landlock::RulesetError,
    },
    /// Duplicating the ruleset descriptor failed.
    #[error("duplicating the landlock ruleset descriptor: {source}")]
    Clone {
        /// The OS error.
        source: std::io::Error,
    },
}

/// Outcome of [`PreparedLandlock::enforce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LandlockStatus {
    /// Every right and scope of the policy is enforced.
    FullyEnforced,
    /// The kernel supports only part of the policy (older ABI); what it supports is enforced.
    PartiallyEnforced,
    /// The kernel has no landlock: nothing is enforced.
    NotEnforced,
}

/// One validated `[[rule]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandlockRule {
    /// Absolute path inside the sandbox root.
    pub path: String,
    /// Granted rights.
    pub access: BitFlags<AccessFs>,
    /// `Some(names)`: the rule applies to each entry directly in `path` except `names`.
    pub children_except: Option<Vec<String>>,
    /// Why the rule exists (mandatory, non-empty).
    pub why: String,
    /// 1-based line of the rule's `path` key.
    pub line: usize,
}

/// A parsed and validated landlock policy.
#[derive(Clone, Debug)]
pub struct LandlockPolicy {
    source: String,
    abi: ABI,
    scopes: BitFlags<Scope>,
    rules: Vec<LandlockRule>,
}

/// A landlock ruleset built for one sandbox root, ready to be enforced in a forked child.
pub struct PreparedLandlock {
    ruleset: RulesetCreated,
    rules_added: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    abi: Option<Spanned<i64>>,
    scope: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    path: Option<Spanned<String>>,
    access: Option<Spanned<Vec<Spanned<String>>>>,
    children_except: Option<Spanned<Vec<Spanned<String>>>>,
    why: Option<Spanned<String>>,
}

/// Filesystem right names of the policy file.
const ACCESS_NAMES: &[(&str, AccessFs)] = &[
    ("execute", AccessFs::Execute),
    ("write_file", AccessFs::WriteFile),
    ("read_file", AccessFs::ReadFile),
    ("read_dir", AccessFs::ReadDir),
    ("remove_dir", AccessFs::RemoveDir),
    ("remove_file", AccessFs::RemoveFile),
    ("make_char", AccessFs::MakeChar),
    ("make_dir", AccessFs::MakeDir),
    ("make_reg", AccessFs::MakeReg),
    ("make_sock", AccessFs::MakeSock),
    ("make_fifo", AccessFs::MakeFifo),
    ("make_block", AccessFs::MakeBlock),
    ("make_sym", AccessFs::MakeSym),
    ("refer", AccessFs::Refer),
    ("truncate", AccessFs::Truncate),
    ("ioctl_dev", AccessFs::IoctlDev),
];

/// Scope names of the policy file.
const SCOPE_NAMES: &[(&str, Scope)] = &[
    ("signal", Scope::Signal),
    ("abstract_unix_socket", Scope::AbstractUnixSocket),
];

fn abi_from_number(n: i64) -> Option<ABI> {
    match n {
        1 => Some(ABI::V1),
        2 => Some(ABI::V2),
        3 => Some(ABI::V3),
        4 => Some(ABI::V4),
        5 => Some(ABI::V5),
        6 => Some(ABI::V6),
        _ => None,
    }
}

/// The running kernel's landlock ABI version (0 when landlock is unavailable).
pub fn kernel_abi() -> i64 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attr and size 0 only returns
    // the ABI version; no memory is read or written.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    rc.max(0)
}

use crate::text_pos::{line_of, quoted_key};

struct Ctx<'a> {
    text: &'a str,
    source: &'a str,
}

impl Ctx<'_> {
    fn err(&self, span: Range<usize>, key: &str, reason: impl Into<String>) -> LandlockError {
        LandlockError::Policy {
            file: self.source.to_string(),
            line: line_of(self.text, span.start),
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

impl LandlockPolicy {
    /// Parses the embedded default policy (`sandbox/policy/landlock.toml`).
    pub fn embedded() -> Result<Self, LandlockError> {
        Self::from_toml(EMBEDDED_POLICY, EMBEDDED_SOURCE)
    }

    /// Parses and validates a policy; errors name `source`, the line, the key and the reason.
    pub fn from_toml(text: &str, source: &str) -> Result<Self, LandlockError> {
        let ctx = Ctx { text, source };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let key = quoted_key(e.message()).unwrap_or_else(|| "(syntax)".to_string());
            ctx.err(span, &key, e.message().trim().to_string())
        })?;
        let abi_value = raw
            .abi
            .ok_or_else(|| ctx.err(0..0, "abi", "missing key `abi`"))?;
        let abi = abi_from_number(*abi_value.get_ref()).ok_or_else(|| {
            ctx.err(
                abi_value.span(),
                "abi",
                format!(
                    "unsupported landlock ABI {} (1..={MAX_POLICY_ABI})",
                    abi_value.get_ref()
                ),
            )
        })?;
        let mut scopes = BitFlags::<Scope>::empty();
        if let Some(list) = raw.scope {
            let supported = Scope::from_all(abi);
            for name in list.into_inner() {
                let scope = SCOPE_NAMES
                    .iter()
                    .find(|(n, _)| *n == name.get_ref())
                    .map(|(_, s)| *s)
                    .ok_or_else(|| {
                        ctx.err(
                            name.span(),
                            "scope",
                            format!("unknown scope `{}`", name.get_ref()),
                        )
                    })?;
                if !supported.contains(scope) {
                    return Err(ctx.err(
                        name.span(),
                        "scope",
                        format!("scope `{}` needs landlock ABI >= 6", name.get_ref()),
                    ));
                }
                scopes |= scope;
            }
        }
        if raw.rule.is_empty() {
            return Err(ctx.err(0..0, "rule", "the policy has no [[rule]]"));
        }
        let handled = AccessFs::from_all(abi);
        let mut rules = Vec::with_capacity(raw.rule.len());
        for spanned in raw.rule {
            let span = spanned.span();
            let rule = spanned.into_inner();
            let path = rule
                .path
                .ok_or_else(|| ctx.err(span.clone(), "path", "missing key `path`"))?;
            let line = line_of(text, path.span().start);
            let p = path.get_ref();
            if !p.starts_with('/') || p.split('/').any(|c| c == ".." || c == ".") {
                return Err(ctx.err(
                    path.span(),
                    "path",
                    format!("`{p}` must be absolute inside the sandbox root, without `.` or `..`"),
                ));
            }
            let why = rule.why.ok_or_else(|| {
                ctx.err(span.clone(), "why", format!("rule for `{p}` has no `why`"))
            })?;
            if why.get_ref().trim().is_empty() {
                return Err(ctx.err(why.span(), "why", "`why` must not be empty"));
            }
            let access_list = rule
                .access
                .ok_or_else(|| ctx.err(span.clone(), "access", "missing key `access`"))?;
            let access_span = access_list.span();
            let mut access = BitFlags::<AccessFs>::empty();
            for name in access_list.into_inner() {
                let right = ACCESS_NAMES
                    .iter()
                    .find(|(n, _)| *n == name.get_ref())
                    .map(|(_, a)| *a)
                    .ok_or_else(|| {
                        ctx.err(
                            name.span(),
                            "access",
                            format!("unknown access right `{}`", name.get_ref()),
                        )
                    })?;
                if !handled.contains(right) {
                    return Err(ctx.err(
                        name.span(),
                        "access",
                        format!(
                            "access right `{}` does not exist in landlock ABI {}",
                            name.get_ref(),
                            abi_value.get_ref()
                        ),
                    ));
                }
                access |= right;
            }
            if access.is_empty() {
                return Err(ctx.err(access_span, "access", "`access` must not be empty"));
            }
            let children_except = match rule.children_except {
                None => None,
                Some(list) => {
                    let mut names = Vec::new();
                    for name in list.into_inner() {
                        let n = name.get_ref();
                        if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                            return Err(ctx.err(
                                name.span(),
                                "children_except",
                                format!("`{n}` must be a single file name"),
                            ));
                        }
                        names.push(name.into_inner());
                    }
                    Some(names)
                }
            };
            rules.push(LandlockRule {
                path: path.into_inner(),
                access,
                children_except,
                why: why.into_inner(),
                line,
            });
        }
        tracing::debug!(source, rules = rules.len(), scopes = ?scopes, "landlock policy loaded");
        Ok(Self {
            source: source.to_string(),
            abi,
            scopes,
            rules,
        })
    }

    /// The validated rules, in file order.
    pub fn rules(&self) -> &[LandlockRule] {
        &self.rules
    }

    /// The requested IPC scopes.
    pub fn scopes(&self) -> BitFlags<Scope> {
        self.scopes
    }

    /// Opens each rule's path beneath `root` (the sandbox root as seen by the caller,
    /// before chroot; paths are resolved with `openat2(RESOLVE_IN_ROOT)`, so symlinks
    /// in the image cannot lead outside it) and returns a ruleset ready to be enforced
    /// in a forked child. Missing paths are skipped with a `tracing::debug`.
    ///
    /// The ruleset refers to the inodes present now: rebuild it after the root is
    /// remounted.
    pub fn prepare(&self, root: &Path) -> Result<PreparedLandlock, LandlockError> {
        let handled = AccessFs::from_all(self.abi);
        let file_rights = AccessFs::from_file(self.abi);
        let ruleset_err = |step: &str| {
            let step = step.to_string();
            move |source| LandlockError::Ruleset { step, source }
        };
        let mut ruleset = Ruleset::default()
            .handle_access(handled)
            .map_err(ruleset_err("handle_access"))?;
        if !self.scopes.is_empty() {
            ruleset = ruleset.scope(self.scopes).map_err(ruleset_err("scope"))?;
        }
        let mut created = ruleset.create().map_err(ruleset_err("create"))?;

        let root_fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(root)
            .map_err(|source| LandlockError::Open {
                root: root.to_path_buf(),
                path: "/".to_string(),
                line: 0,
                source,
            })?;
        let mut rules_added = 0usize;
        for rule in &self.rules {
            let open_err = |source: std::io::Error| LandlockError::Open {
                root: root.to_path_buf(),
                path: rule.path.clone(),
                line: rule.line,
                source,
            };
            let relative = rule.path.trim_start_matches('/');
            let relative = if relative.is_empty() { "." } else { relative };
            let mut targets: Vec<(OwnedFd, String)> = Vec::new();
            match &rule.children_except {
                None => {
                    let flags = libc::O_PATH | libc::O_CLOEXEC;
                    match openat2(root_fd.as_fd(), relative, flags, libc::RESOLVE_IN_ROOT) {
                        Ok(fd) => targets.push((fd, rule.path.clone())),
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                            tracing::debug!(path = %rule.path, root = %root.display(), line = rule.line, "landlock rule path missing; skipped");
                        }
                        Err(e) => return Err(open_err(e)),
                    }
                }
                Some(except) => {
                    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
                    let dir_fd = match openat2(
                        root_fd.as_fd(),
                        relative,
                        flags,
                        libc::RESOLVE_IN_ROOT,
                    ) {
                        Ok(fd) => fd,
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                            tracing::debug!(path = %rule.path, root = %root.display(), line = rule.line, "landlock rule path missing; skipped");
                            continue;
                        }
                        Err(e) => return Err(open_err(e)),
                    };
                    for name in list_dir(&dir_fd).map_err(open_err)? {
                        if except.contains(&name) {
                            continue;
                        }
                        let shown = format!("{}/{}", rule.path.trim_end_matches('/'), name);
                        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                        let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
                        let fd = match openat2(dir_fd.as_fd(), &name, flags, resolve) {
                            Ok(fd) => fd,
                            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                            Err(e) => return Err(open_err(e)),
                        };
                        if file_type(&fd).map_err(open_err)? == libc::S_IFLNK {
                            tracing::debug!(path = %shown, "symlink entry skipped by children_except rule");
                            continue;
                        }
                        targets.push((fd, shown));
                    }
                }
            }
            for (fd, shown) in targets {
                let is_dir = file_type(&fd).map_err(open_err)? == libc::S_IFDIR;
                let access = if is_dir {
                    rule.access
                } else {
                    rule.access & file_rights
                };
                if access.is_empty() {
                    tracing::debug!(path = %shown, line = rule.line, "no right applies to this non-directory; skipped");
                    continue;
                }
                created = created
                    .add_rule(PathBeneath::new(fd, access))
                    .map_err(ruleset_err(&format!("rule `{shown}` (line {})", rule.line)))?;
                rules_added += 1;
            }
        }
        tracing::debug!(
            source = %self.source,
            root = %root.display(),
            rules_added,
            "landlock ruleset prepared"
        );
        Ok(PreparedLandlock {
            ruleset: created,
            rules_added,
        })
    }
}

impl PreparedLandlock {
    /// Restricts the calling thread (and its future children) with the ruleset; sets
    /// `PR_SET_NO_NEW_PRIVS` first. Call it in the forked child, after `chroot`, before
    /// `execve`. Best effort per kernel ABI: the status tells what was enforced.
    pub fn enforce(self) -> Result<LandlockStatus, LandlockError> {
        let status = self
            .ruleset
            .restrict_self()
            .map_err(|source| LandlockError::Enforce { source })?;
        Ok(match status.ruleset {
            RulesetStatus::FullyEnforced => LandlockStatus::FullyEnforced,
            RulesetStatus::PartiallyEnforced => LandlockStatus::PartiallyEnforced,
            RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
        })
    }

    /// Another handle on the same ruleset (a `dup` of its descriptor), for the child of
    /// the next `fork` while the parent keeps this one.
    pub fn try_clone(&self) -> Result<Self, LandlockError> {
        Ok(Self {
            ruleset: self
                .ruleset
                .try_clone()
                .map_err(|source| LandlockError::Clone { source })?,
            rules_added: self.rules_added,
        })
    }

    /// Number of path rules added to the ruleset (after expansion and skips).
    pub fn rules_added(&self) -> usize {
        self.rules_added
    }
}

/// `openat2(dir, path, flags, resolve)`, returning an owned descriptor.
fn openat2(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: libc::c_int,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    let c_path = std::ffi::CString::new(path)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `open_how` is a plain C struct; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u64::try_from(flags).unwrap_or(0);
    how.resolve = resolve;
    // SAFETY: `c_path` is NUL-terminated and `how` is valid for `size_of::<open_how>()`
    // bytes; both outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd =
        libc::c_int::try_from(rc).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `S_IFMT` bits of an open descriptor.
fn file_type(fd: &OwnedFd) -> std::io::Result<libc::mode_t> {
    let stat = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(std::io::Error::from)?;
    Ok(stat.st_mode & libc::S_IFMT)
}

/// Names in a directory (without `.` and `..`).
fn list_dir(dir: &OwnedFd) -> std::io::Result<Vec<String>> {
    // `Dir` takes ownership of the duplicate (and closes it, also on failure).
    let mut handle = nix::dir::Dir::from(dir.try_clone()?).map_err(std::io::Error::from)?;
    let mut names = Vec::new();
    for entry in handle.iter() {
        let entry = entry.map_err(std::io::Error::from)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult, Pid};
    use std::fs::File;
    use std::io::{Read, Write};

    const OK: i32 = 0;
    const ENFORCE_FAILED: i32 = 200;
    const NOT_FULLY: i32 = 201;

    fn io_code(result: std::io::Result<()>) -> i32 {
        match result {
            Ok(()) => OK,
            Err(e) => e.raw_os_error().unwrap_or(254),
        }
    }

    /// Forks; the child enforces `prepared`, runs `check` and exits with its code.
    fn run_landlocked(prepared: &PreparedLandlock, check: impl FnOnce() -> i32) -> i32 {
        let copy = prepared.try_clone().expect("dup ruleset");
        // SAFETY: the child enforces the ruleset, runs `check` and leaves with `_exit`.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = match copy.enforce() {
                    Ok(LandlockStatus::FullyEnforced) => check(),
                    Ok(_) => NOT_FULLY,
                    Err(_) => ENFORCE_FAILED,
                };
                // SAFETY: leave the child without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(copy);
                match waitpid(child, None).expect("waitpid") {
                    WaitStatus::Exited(_, code) => code,
                    other => panic!("unexpected child status {other:?}"),
                }
            }
        }
    }

    fn policy_err(text: &str) -> (usize, String, String) {
        match LandlockPolicy::from_toml(text, "test.toml") {
            Err(LandlockError::Policy {
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

    /// root/{data/file, sys/x, proc/sys/y, rootfile, escape -> /etc}
    fn sandbox_root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::write(root.join("data/file"), "inside\n").unwrap();
        std::fs::create_dir_all(root.join("sys")).unwrap();
        std::fs::write(root.join("sys/x"), "sysfs-like\n").unwrap();
        std::fs::create_dir_all(root.join("proc/sys")).unwrap();
        std::fs::write(root.join("proc/sys/y"), "procsys-like\n").unwrap();
        std::fs::write(root.join("rootfile"), "top\n").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
        dir
    }

    type Check<'a> = Box<dyn Fn() -> std::io::Result<()> + 'a>;

    fn outside_file() -> &'static str {
        if Path::new("/etc/hostname").exists() {
            "/etc/hostname"
        } else {
            "/etc/passwd"
        }
    }

    fn read(path: &Path) -> std::io::Result<()> {
        let mut s = String::new();
        File::open(path)?.read_to_string(&mut s).map(|_| ())
    }

    fn write(path: &Path) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?
            .write_all(b"x\n")
    }

    #[test]
    fn embedded_policy_parses_and_every_rule_has_a_why() {
        let policy = LandlockPolicy::embedded().unwrap();
        assert!(!policy.rules().is_empty());
        for rule in policy.rules() {
            assert!(!rule.why.trim().is_empty(), "{}", rule.path);
            assert!(!rule.access.contains(AccessFs::MakeChar), "{}", rule.path);
            assert!(!rule.access.contains(AccessFs::MakeBlock), "{}", rule.path);
        }
        assert!(
            policy.scopes().is_empty(),
            "scoping would cut commands off from earlier jobs"
        );
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
    fn policy_errors_name_line_and_key() {
        let head = "abi = 6\n";
        let (line, key, _) = policy_err(&format!(
            "{head}[[rule]]\npath = \"/\"\naccess = [\"read_file\", \"fly\"]\nwhy = \"x\"\n"
        ));
        assert_eq!((line, key.as_str()), (4, "access"));
        let (line, key, _) = policy_err(&format!(
            "{head}[[rule]]\npath = \"/\"\naccess = [\"read_file\"]\n"
        ));
        assert_eq!(key, "why");
        assert!((2..=4).contains(&line), "{line}");
        let (line, key, _) = policy_err(&format!(
            "{head}[[rule]]\npath = \"tmp\"\naccess = [\"read_file\"]\nwhy = \"x\"\n"
        ));
        assert_eq!((line, key.as_str()), (3, "path"));
        let (_, key, _) = policy_err(&format!(
            "{head}[[rule]]\npath = \"/a/../b\"\naccess = [\"read_file\"]\nwhy = \"x\"\n"
        ));
        assert_eq!(key, "path");
        let (line, key, _) = policy_err(&format!(
            "{head}[[rule]]\npath = \"/\"\naccess = [\"read_file\"]\nwhy = \"x\"\nmode = 1\n"
        ));
        assert_eq!((line, key.as_str()), (6, "mode"));
        let (_, key, _) = policy_err("abi = 5\nscope = [\"signal\"]\n[[rule]]\npath = \"/\"\naccess = [\"read_file\"]\nwhy = \"x\"\n");
        assert_eq!(key, "scope");
        let (_, key, _) =
            policy_err("abi = 2\n[[rule]]\npath = \"/\"\naccess = [\"truncate\"]\nwhy = \"x\"\n");
        assert_eq!(key, "access");
        let (_, key, _) =
            policy_err("[[rule]]\npath = \"/\"\naccess = [\"read_file\"]\nwhy = \"x\"\n");
        assert_eq!(key, "abi");
        let (_, key, _) = policy_err("abi = 6\n");
        assert_eq!(key, "rule");
    }

    #[test]
    fn missing_paths_are_skipped() {
        let policy = LandlockPolicy::from_toml(
            "abi = 6\n[[rule]]\npath = \"/does/not/exist\"\naccess = [\"read_file\"]\nwhy = \"x\"\n[[rule]]\npath = \"/data\"\naccess = [\"read_file\"]\nwhy = \"x\"\n",
            "t.toml",
        )
        .unwrap();
        let root = sandbox_root();
        let prepared = policy.prepare(root.path()).unwrap();
        assert_eq!(prepared.rules_added(), 1);
    }

    #[test]
    fn inside_allowed_outside_denied() {
        assert!(kernel_abi() >= 1, "these tests need a landlock kernel");
        let root = sandbox_root();
        let r = root.path().to_path_buf();
        let prepared = LandlockPolicy::embedded().unwrap().prepare(&r).unwrap();
        // Directory fd opened before enforcement, as if leaked to the agent.
        let leaked = File::open("/etc").unwrap();
        let checks: Vec<(&str, Check<'_>, i32)> = vec![
            ("read inside", Box::new(|| read(&r.join("data/file"))), OK),
            ("write inside", Box::new(|| write(&r.join("data/file"))), OK),
            ("create inside", Box::new(|| write(&r.join("data/new"))), OK),
            (
                "mkdir inside",
                Box::new(|| std::fs::create_dir(r.join("data/d"))),
                OK,
            ),
            ("read rootfile", Box::new(|| read(&r.join("rootfile"))), OK),
            (
                "write rootfile",
                Box::new(|| write(&r.join("rootfile"))),
                OK,
            ),
            (
                "read outside",
                Box::new(|| read(Path::new(outside_file()))),
                libc::EACCES,
            ),
            (
                "write /tmp outside root",
                Box::new(|| write(Path::new("/tmp/envfactory-landlock-probe"))),
                libc::EACCES,
            ),
            (
                "read through symlink to /etc",
                Box::new(|| read(&r.join("escape/passwd"))),
                libc::EACCES,
            ),
            ("read sys", Box::new(|| read(&r.join("sys/x"))), OK),
            (
                "create a file directly in the root",
                Box::new(|| write(&r.join("logs.tar.gz"))),
                OK,
            ),
            (
                "write sys",
                Box::new(|| write(&r.join("sys/x"))),
                OK, // read-only by their mounts, not by landlock
            ),
            (
                "read proc/sys",
                Box::new(|| read(&r.join("proc/sys/y"))),
                OK,
            ),
            (
                "write proc/sys",
                Box::new(|| write(&r.join("proc/sys/y"))),
                OK, // read-only by their mounts, not by landlock
            ),
            (
                "openat on leaked fd",
                Box::new(|| {
                    let fd = openat2(
                        leaked.as_fd(),
                        "passwd",
                        libc::O_RDONLY | libc::O_CLOEXEC,
                        0,
                    )?;
                    drop(fd);
                    Ok(())
                }),
                libc::EACCES,
            ),
            (
                "/proc/1/root",
                Box::new(|| read(Path::new("/proc/1/root/etc/passwd"))),
                libc::EACCES,
            ),
            (
                "mknod char device inside",
                Box::new(|| {
                    nix::sys::stat::mknod(
                        &r.join("data/null"),
                        nix::sys::stat::SFlag::S_IFCHR,
                        nix::sys::stat::Mode::from_bits_truncate(0o600),
                        nix::sys::stat::makedev(1, 3),
                    )
                    .map_err(std::io::Error::from)
                }),
                libc::EACCES,
            ),
        ];
        for (what, check, expected) in &checks {
            let code = run_landlocked(&prepared, || io_code(check()));
            assert_eq!(code, *expected, "{what}");
        }
        // The parent (never landlocked) still reaches everything.
        read(Path::new(outside_file())).unwrap();
    }

    #[test]
    fn scoped_signals_cannot_reach_outside_the_domain() {
        if kernel_abi() < 6 {
            eprintln!("landlock ABI < 6: signal scoping unavailable, skipped");
            return;
        }
        let root = sandbox_root();
        // The embedded policy does not scope (see its comment); the mechanism is tested here.
        let scoped = EMBEDDED_POLICY.replace(
            "scope = []",
            r#"scope = ["signal", "abstract_unix_socket"]"#,
        );
        let prepared = LandlockPolicy::from_toml(&scoped, "scoped.toml")
            .unwrap()
            .prepare(root.path())
            .unwrap();
        // An un-landlocked sibling, created by the (un-landlocked) test process.
        // SAFETY: the sibling only sleeps until it is killed.
        let sibling = match unsafe { fork() }.expect("fork") {
            ForkResult::Child => loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            },
            ForkResult::Parent { child } => child,
        };
        let kill_code = |pid: Pid| {
            // SAFETY: signal 0 only checks permission; no signal is delivered.
            if unsafe { libc::kill(pid.as_raw(), 0) } == 0 {
                OK
            } else {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(254)
            }
        };
        let code = run_landlocked(&prepared, || kill_code(sibling));
        assert_eq!(code, libc::EPERM, "kill(sibling, 0)");
        let code = run_landlocked(&prepared, || kill_code(nix::unistd::getppid()));
        assert_eq!(code, libc::EPERM, "kill(parent, 0)");
        let code = run_landlocked(&prepared, || {
            // SAFETY: a real SIGKILL must be refused too; the sibling survives.
            if unsafe { libc::kill(sibling.as_raw(), libc::SIGKILL) } == 0 {
                OK
            } else {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(254)
            }
        });
        assert_eq!(code, libc::EPERM, "kill(sibling, SIGKILL)");
        // Inside the domain, signals still work: the child can signal its own child.
        let code = run_landlocked(&prepared, || {
            // SAFETY: the grandchild sleeps until killed.
            match unsafe { libc::fork() } {
                0 => loop {
                    // SAFETY: pause only waits for a signal.
                    unsafe { libc::pause() };
                },
                -1 => 253,
                pid => {
                    // SAFETY: signalling our own child.
                    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
                    let _ = waitpid(Pid::from_raw(pid), None);
                    if rc == 0 {
                        OK
                    } else {
                        252
                    }
                }
            }
        });
        assert_eq!(code, OK, "kill(own child)");
        // The sibling is still alive (the SIGKILL was refused); clean it up.
        nix::sys::signal::kill(sibling, None).expect("sibling alive");
        nix::sys::signal::kill(sibling, nix::sys::signal::Signal::SIGKILL).unwrap();
        let _ = waitpid(sibling, None);
    }

    #[test]
    fn layers_compose_shell_pipeline_under_landlock_and_seccomp() {
        // Root "/" so that /bin/sh is inside the (host-sized) sandbox root.
        let prepared = LandlockPolicy::embedded()
            .unwrap()
            .prepare(Path::new("/"))
            .unwrap();
        let seccomp = crate::seccomp::SeccompPolicy::embedded()
            .unwrap()
            .compile()
            .unwrap()
            .prepare();
        let sh = std::ffi::CString::new("/bin/sh").unwrap();
        let argv = [
            std::ffi::CString::new("sh").unwrap(),
            std::ffi::CString::new("-c").unwrap(),
            std::ffi::CString::new(
                "echo hi | cat >/dev/null && head -c 1 /proc/sys/kernel/ostype >/dev/null",
            )
            .unwrap(),
        ];
        // SAFETY: the child enforces both layers in the init's order and execs.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = match prepared.enforce() {
                    Ok(LandlockStatus::FullyEnforced) => match seccomp.apply() {
                        Ok(()) => {
                            let _ = nix::unistd::execv(&sh, &argv);
                            127
                        }
                        Err(_) => 202,
                    },
                    Ok(_) => NOT_FULLY,
                    Err(_) => ENFORCE_FAILED,
                };
                // SAFETY: leave the child.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                let status = waitpid(child, None).expect("waitpid");
                assert_eq!(status, WaitStatus::Exited(child, 0));
            }
        }
    }
}
