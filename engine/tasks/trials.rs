//! Hack trials and honest alternatives, kept as data: `engine/tasks/trials/<task>.trials`, one
//! file per task, run by one test (`tests/it/tasks.rs`), so adding a trial is a one-file change.
//!
//! A file is a list of trials. Each starts with a comment line saying what it tries,
//! `# hack: ...` (a cheat: the verdict must be a failure) or `# honest: ...` (an unusual but
//! real solution: the verdict must be a success), followed by its commands, one per line, each
//! one step of an episode. Other `#` lines and blank lines are comments. `@NAME@` is replaced
//! by the task's value for `NAME` ([`Task::trial_vars`]: paths, ports, names drawn from the
//! seed); an unknown name is an error, so a typo cannot silently test nothing.

use super::Task;
use crate::instance::TaskSetup;
use std::collections::BTreeMap;

/// What a trial must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialKind {
    /// A cheat: it must not be judged a success.
    Hack,
    /// A real solution by an unusual route: it must be judged a success.
    Honest,
}

/// One trial, its variables replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    pub kind: TrialKind,
    /// What it tries (the text after `# hack:` or `# honest:`).
    pub name: String,
    /// One command per step.
    pub commands: Vec<String>,
    /// Where it starts in its file (1-based), for messages.
    pub line: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error("{file}:{line}: {reason}")]
    Bad {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("no trials file for task `{0}` (engine/tasks/trials/{0}.trials)")]
    Missing(String),
}

/// The trials file of a task: its name and text, embedded at build time.
pub fn source(task: &str) -> Option<(&'static str, &'static str)> {
    let (name, text) = match task {
        "archive-logs" => ("archive-logs", include_str!("trials/archive-logs.trials")),
        "free-disk" => ("free-disk", include_str!("trials/free-disk.trials")),
        "restore-service" => (
            "restore-service",
            include_str!("trials/restore-service.trials"),
        ),
        "repair-config" => ("repair-config", include_str!("trials/repair-config.trials")),
        "kill-runaway" => ("kill-runaway", include_str!("trials/kill-runaway.trials")),
        "fix-permissions" => (
            "fix-permissions",
            include_str!("trials/fix-permissions.trials"),
        ),
        "fix-path" => ("fix-path", include_str!("trials/fix-path.trials")),
        _ => return None,
    };
    Some((name, text))
}

/// Parse a trials file (variables not yet replaced).
pub fn parse(file: &str, text: &str) -> Result<Vec<Trial>, TrialError> {
    let bad = |line: usize, reason: &str| TrialError::Bad {
        file: format!("engine/tasks/trials/{file}.trials"),
        line,
        reason: reason.to_string(),
    };
    let mut out: Vec<Trial> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end();
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            let head = [("hack:", TrialKind::Hack), ("honest:", TrialKind::Honest)]
                .into_iter()
                .find_map(|(p, k)| rest.strip_prefix(p).map(|name| (k, name.trim())));
            if let Some((kind, name)) = head {
                if name.is_empty() {
                    return Err(bad(n, "a trial needs a name: what it tries"));
                }
                if let Some(prev) = out.last() {
                    if prev.commands.is_empty() {
                        return Err(bad(prev.line, "a trial without commands"));
                    }
                }
                out.push(Trial {
                    kind,
                    name: name.to_string(),
                    commands: Vec::new(),
                    line: n,
                });
            }
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(t) => t.commands.push(line.to_string()),
            None => {
                return Err(bad(
                    n,
                    "a command before the first `# hack:` or `# honest:`",
                ))
            }
        }
    }
    if let Some(t) = out.last() {
        if t.commands.is_empty() {
            return Err(bad(t.line, "a trial without commands"));
        }
    }
    Ok(out)
}

/// Replace every `@NAME@` of `text` by its value.
fn expand(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('@') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if name_len > 0 && after[name_len..].starts_with('@') {
            let name = &after[..name_len];
            let v = vars
                .get(name)
                .ok_or_else(|| format!("unknown variable @{name}@"))?;
            out.push_str(v);
            rest = &after[name_len + 1..];
        } else {
            out.push('@');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The trials of `task` for one instance's setup, variables replaced.
pub fn for_task(task: &dyn Task, setup: &TaskSetup) -> Result<Vec<Trial>, TrialError> {
    let (file, text) =
        source(task.name()).ok_or_else(|| TrialError::Missing(task.name().into()))?;
    let vars = task.trial_vars(setup);
    parse(file, text)?
        .into_iter()
        .map(|t| {
            let commands = t
                .commands
                .iter()
                .map(|c| expand(c, &vars))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|reason| TrialError::Bad {
                    file: format!("engine/tasks/trials/{file}.trials"),
                    line: t.line,
                    reason,
                })?;
            Ok(Trial { commands, ..t })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_parse_into_named_trials_of_both_kinds() {
        let t = parse(
            "x",
            "# header comment\n\n# hack: touch it\ntouch /a\n# a note\ntouch /b\n# honest: by hand\ncp /x /y\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].kind, t[0].name.as_str(), t[0].line),
            (TrialKind::Hack, "touch it", 3)
        );
        assert_eq!(t[0].commands, ["touch /a", "touch /b"]);
        assert_eq!(t[1].kind, TrialKind::Honest);
        for (text, want) in [
            ("touch /a\n", "x.trials:1: a command before"),
            (
                "# hack: a\n# hack: b\nls\n",
                "x.trials:1: a trial without commands",
            ),
            ("# hack:\nls\n", "x.trials:1: a trial needs a name"),
            ("# honest: last\n", "x.trials:1: a trial without commands"),
        ] {
            let e = parse("x", text).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn variables_are_replaced_and_unknown_ones_refused() {
        let vars: BTreeMap<String, String> = [("ROOT".to_string(), "/srv/a".to_string())].into();
        assert_eq!(
            expand("cd @ROOT@ && mail a@b.c @ x@@", &vars).unwrap(),
            "cd /srv/a && mail a@b.c @ x@@"
        );
        assert!(expand("ls @NOPE@", &vars).unwrap_err().contains("@NOPE@"));
    }

    #[test]
    fn every_task_has_a_trials_file_with_hacks_that_parses() {
        for task in super::super::all() {
            let (file, text) = source(task.name()).unwrap_or_else(|| panic!("{}", task.name()));
            let trials = parse(file, text).unwrap();
            assert!(
                trials.iter().any(|t| t.kind == TrialKind::Hack),
                "{}: no hack trial",
                task.name()
            );
        }
    }
}
