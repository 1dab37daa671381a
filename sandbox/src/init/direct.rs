//! Shell commands that need no shell, run as argv: `ls -la /tmp`, `cat /etc/os-release`,
//! `python3 -m pytest -q tests/`. `/bin/sh -c` would fork once more and exec `dash` (dynamic
//! linking included) before the command; here the zygote's child execs the command itself,
//! and gives the command exactly what `dash` would have given it, so the two paths cannot be
//! told apart by the command's result:
//!
//! - **which program**: the words are split as dash splits them (only characters that are
//!   never special, so no quoting, expansion, globbing, redirection, separators, comments,
//!   assignments or reserved words can occur), and the first is never a dash builtin (those
//!   behave differently from the programs of the same name); the `PATH` search is dash's
//!   (first candidate that exists, empty entries are the working directory);
//! - **the environment**: what dash exports, in its order (its 39-bucket table), `PWD` kept if
//!   it names the working directory, else set to it, as dash does; environments that dash
//!   would change otherwise (names it does not import, duplicates, the variables it resets at
//!   start: `IFS`, `OPTIND`, `PPID`, `LINENO`) take the shell path;
//! - **failures**: if the program cannot be executed (not found, not executable, a script
//!   without `#!`, ...), the child execs `/bin/sh -c` with the original command instead, so
//!   the 127/126 statuses, the messages and the ENOEXEC fallback are dash's own;
//! - **death by a signal**: reported as dash reports it, exit status 128+N and the signal's
//!   description on stderr (none for SIGINT and SIGPIPE).
//!
//! Only when the root's `/bin/sh` is its `/bin/dash` (same file; checked at every command, so
//! an agent that replaces either gets the shell path) and the locale variables name the C
//! locale (dash's messages are then the C library's English ones). Not the same: no `sh`
//! process sits between init and the command (its parent is init, as for an argv command).

/// dash's builtins and reserved words: a first word among them keeps the shell.
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo", "eval",
    "exec", "exit", "export", "false", "fc", "fg", "getopts", "hash", "jobs", "kill", "local",
    "printf", "pwd", "read", "readonly", "return", "set", "shift", "test", "times", "trap", "true",
    "type", "ulimit", "umask", "unalias", "unset", "wait", "!", "case", "do", "done", "elif",
    "else", "esac", "fi", "for", "if", "in", "then", "until", "while", "{", "}",
];

/// Variables dash sets itself at start (its value would replace the environment's).
const RESET_BY_DASH: &[&str] = &["IFS", "OPTIND", "PPID", "LINENO"];

/// dash's initial variables in the order of its `varinit` table; it prepends each to its
/// bucket, so within a bucket they come before imported variables, the last one first. Those
/// marked uncertain exist only in some builds of dash: an environment where one of them
/// shares a bucket with another variable takes the shell path.
const VARINIT: &[(&str, bool)] = &[
    ("ATTY", true),
    ("IFS", false),
    ("MAIL", false),
    ("MAILPATH", false),
    ("PATH", false),
    ("PS1", false),
    ("PS2", false),
    ("PS4", false),
    ("OPTIND", false),
    ("LINENO", true),
    ("TERM", true),
    ("HISTSIZE", true),
];

const VTABSIZE: u32 = 39;

/// A plain character: never special to the shell in any position it may take here.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-./,:+@%".contains(&b)
}

fn is_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// dash's `hashvar`.
fn bucket(name: &str) -> u32 {
    let b = name.as_bytes();
    let mut h = u32::from(b.first().copied().unwrap_or(0)) << 4;
    for c in b {
        h += u32::from(*c);
    }
    h % VTABSIZE
}

/// The words of `cmd` if it needs no shell in this environment (see the module), else `None`.
pub(crate) fn words(cmd: &str, env: &[String]) -> Option<Vec<String>> {
    let words: Vec<&str> = cmd.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    // '=' may appear in arguments (`dd if=x`); in the first word it could be an assignment.
    let ok = cmd
        .bytes()
        .all(|b| plain(b) || b == b' ' || b == b'\t' || b == b'=')
        && !first.contains('=')
        && !SHELL_WORDS.contains(&first);
    if !ok || !environment_is_plain(env) {
        return None;
    }
    Some(words.into_iter().map(str::to_string).collect())
}

/// An environment dash passes on as it is (up to order and `PWD`): valid, distinct names,
/// `PATH` set, none that dash resets, no order dash's build decides, the C locale.
fn environment_is_plain(env: &[String]) -> bool {
    let mut names: Vec<&str> = Vec::with_capacity(env.len());
    for kv in env {
        let Some((n, v)) = kv.split_once('=') else {
            return false;
        };
        if !is_name(n) || names.contains(&n) || RESET_BY_DASH.contains(&n) {
            return false;
        }
        if matches!(n, "LANG" | "LC_ALL" | "LC_MESSAGES")
            && !matches!(v, "" | "C" | "POSIX" | "C.UTF-8" | "C.utf8")
        {
            return false;
        }
        names.push(n);
    }
    if !names.contains(&"PATH") {
        return false;
    }
    let uncertain = |n: &str| VARINIT.iter().any(|(v, u)| *u && *v == n);
    names
        .iter()
        .all(|n| !uncertain(n) || names.iter().filter(|m| bucket(m) == bucket(n)).count() == 1)
}

/// The environment dash exports from `env` (checked by [`words`]) with `PWD` set to `pwd`:
/// bucket by bucket, its initial variables first (last of its table first), then the others
/// in the order given.
pub(crate) fn dash_environment(env: &[String], pwd: &str) -> Vec<String> {
    let mut all: Vec<String> = env
        .iter()
        .filter(|kv| !kv.starts_with("PWD="))
        .cloned()
        .collect();
    // PWD is dash's to set: replaced in its place if imported, else appended.
    match env.iter().position(|kv| kv.starts_with("PWD=")) {
        Some(i) => all.insert(i.min(all.len()), format!("PWD={pwd}")),
        None => all.push(format!("PWD={pwd}")),
    }
    let key = |kv: &String| {
        let n = kv.split_once('=').map_or(kv.as_str(), |x| x.0);
        let init = VARINIT.iter().position(|(v, _)| *v == n);
        // Initial variables first, the later in the table the earlier in the bucket.
        let within = init.map_or(usize::MAX, |i| VARINIT.len() - i);
        (bucket(n), init.is_none(), within)
    };
    // Stable: imported variables keep the order given within their bucket.
    all.sort_by_key(key);
    all
}

/// The working directory dash would put in `PWD`: the environment's `PWD` if it is absolute
/// and names the working directory, else the physical path (`getcwd`). `None` if there is no
/// such path (the caller then takes the shell path).
pub(crate) fn dash_pwd(env: &[String]) -> Option<String> {
    let cur = std::fs::metadata(".").ok()?;
    if let Some(p) = env.iter().find_map(|kv| kv.strip_prefix("PWD=")) {
        use std::os::unix::fs::MetadataExt;
        if p.starts_with('/') {
            if let Ok(m) = std::fs::metadata(p) {
                if m.dev() == cur.dev() && m.ino() == cur.ino() {
                    return Some(p.to_string());
                }
            }
        }
    }
    std::env::current_dir()
        .ok()
        .and_then(|d| d.into_os_string().into_string().ok())
}

/// What dash writes to stderr when its command dies of `sig`: the C library's description,
/// except for SIGINT and SIGPIPE.
pub(crate) fn signal_message(sig: i32) -> Option<String> {
    if sig == libc::SIGINT || sig == libc::SIGPIPE {
        return None;
    }
    // SAFETY: strsignal returns a pointer to a static or thread-local string, read at once
    // (init is single-threaded).
    let p = unsafe { libc::strsignal(sig) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string from the C library.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    Some(format!("{}\n", s.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_plain_commands_skip_the_shell() {
        let e = env(&["PATH=/bin", "HOME=/root"]);
        assert_eq!(
            words("ls  -la\t/tmp", &e).unwrap(),
            vec!["ls", "-la", "/tmp"]
        );
        assert_eq!(words("dd if=/dev/zero", &e).unwrap().len(), 2);
        for c in [
            "", "  ", "echo hi", "true", "cd /", "FOO=1 ls", "ls *", "ls ~", "ls #x", "ls 'a'",
            "ls \"a\"", "ls $HOME", "ls > x", "ls | wc", "ls; ls", "ls && ls", "ls\nls", "ls `x`",
            "ls \\a", "ls {a,b}", "if", "! ls", "ls (", "ls é", "[ -f x ]", ". x",
        ] {
            assert!(words(c, &e).is_none(), "{c:?} must keep the shell");
        }
    }

    #[test]
    fn environments_dash_would_change_keep_the_shell() {
        for e in [
            env(&["HOME=/root"]),                    // no PATH
            env(&["PATH=/bin", "PATH=/usr/bin"]),    // duplicate
            env(&["PATH=/bin", "A-B=1"]),            // a name dash drops
            env(&["PATH=/bin", "IFS=x"]),            // reset by dash
            env(&["PATH=/bin", "LANG=de_DE.UTF-8"]), // localised messages
            env(&["PATH=/bin", "noequals"]),
        ] {
            assert!(words("ls", &e).is_none(), "{e:?}");
        }
        assert!(words("ls", &env(&["PATH=/bin", "LANG=C.UTF-8"])).is_some());
    }

    #[test]
    fn the_environment_is_in_dashs_order() {
        // Observed with dash 0.5.12: `env -i B=1 A=2 PATH=/bin ZZ=3 sh -c env`.
        let e = env(&["B=1", "A=2", "PATH=/bin", "ZZ=3"]);
        assert_eq!(
            dash_environment(&e, "/tmp"),
            env(&["A=2", "PATH=/bin", "ZZ=3", "B=1", "PWD=/tmp"])
        );
        // `env -i TERM=x PATH=/bin HISTSIZE=3 PS1=u A=1 MAIL=2 sh -c env`.
        let e = env(&[
            "TERM=x",
            "PATH=/bin",
            "HISTSIZE=3",
            "PS1=u",
            "A=1",
            "MAIL=2",
        ]);
        assert_eq!(
            dash_environment(&e, "/tmp"),
            env(&[
                "MAIL=2",
                "PS1=u",
                "A=1",
                "TERM=x",
                "PATH=/bin",
                "HISTSIZE=3",
                "PWD=/tmp"
            ])
        );
    }
}
