//! Path and shell helpers shared by synthesis, the perturbations and the tasks.

use super::InstanceError;

/// The sandbox's default `PATH`.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Check and normalise an absolute path for a layer.
pub fn clean_path(path: &str) -> Result<String, InstanceError> {
    let bad = |reason: &str| InstanceError::BadPath {
        path: path.into(),
        reason: reason.into(),
    };
    if !path.starts_with('/') {
        return Err(bad("not absolute"));
    }
    let mut out = String::new();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(bad("contains `..`"));
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        return Err(bad("is the root"));
    }
    for top in ["/proc", "/sys", "/dev"] {
        if out == top || out.starts_with(&format!("{top}/")) {
            return Err(bad("is under a mount the sandbox provides"));
        }
    }
    Ok(out)
}

/// Resolve a symlink target relative to the link's directory (lexically).
pub fn resolve_link(link: &str, target: &str) -> String {
    let joined = if target.starts_with('/') {
        target.to_string()
    } else {
        let dir = link.rsplit_once('/').map_or("", |(d, _)| d);
        format!("{dir}/{target}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

// Quote a string for a POSIX shell (single quotes): the sandbox protocol's, which shell
// commands of both crates use.
pub use sandbox::protocol::sh_quote;
