//! Action files (`engine episode --actions-file`): one action per line; `@N` is catalogue
//! action N, anything else a shell command; blank lines and lines starting with `#` are
//! skipped. Read bounded, errors at `file:line:column`.

use crate::env::Action;
use crate::text::{cut, TextError};
use std::path::{Path, PathBuf};

/// Errors of an action file.
#[derive(Debug, thiserror::Error)]
pub enum ActionsError {
    #[error(transparent)]
    Read(#[from] TextError),
    #[error("{file}:{line}:{column}: {reason}")]
    Invalid {
        file: PathBuf,
        line: usize,
        column: usize,
        reason: String,
    },
}

/// Read and parse an action file.
pub fn read(file: &Path) -> Result<Vec<Action>, ActionsError> {
    parse(&crate::text::read_input(file)?, file)
}

/// Parse the text of an action file; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Vec<Action>, ActionsError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let invalid = |column: usize, reason: String| ActionsError::Invalid {
            file: file.into(),
            line: i + 1,
            column,
            reason,
        };
        let column = line.len() - line.trim_start().len() + 1;
        if let Some(at) = l.find(|c: char| c.is_control() && c != '\t') {
            return Err(invalid(
                column + l[..at].chars().count(),
                format!(
                    "a control character (U+{:04X}) in an action",
                    l[at..].chars().next().map_or(0, u32::from)
                ),
            ));
        }
        if let Some(n) = l.strip_prefix('@') {
            let idx: usize = n.trim().parse().map_err(|_| {
                invalid(
                    column,
                    format!(
                        "`{}` is not a catalogue index (`@N` with N a number)",
                        cut(l)
                    ),
                )
            })?;
            out.push(Action::Index(idx));
        } else {
            out.push(Action::Command(l.to_string()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lines_become_actions_and_errors_are_located() {
        let f = Path::new("a.txt");
        let a = parse("# comment\n\n@2\n  ls -la \n", f).unwrap();
        assert_eq!(a, vec![Action::Index(2), Action::Command("ls -la".into())]);
        let e = parse("ls\n  @two\n", f).unwrap_err().to_string();
        assert_eq!(
            e,
            "a.txt:2:3: `@two` is not a catalogue index (`@N` with N a number)"
        );
        let e = parse("echo a\0b\n", f).unwrap_err().to_string();
        assert_eq!(e, "a.txt:1:7: a control character (U+0000) in an action");
        let e = parse(&format!("@{}\n", "9".repeat(10_000)), f)
            .unwrap_err()
            .to_string();
        assert!(e.len() < 200, "{e}");
    }
}
