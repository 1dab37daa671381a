//! Text as users give it and see it: input files read with a size bound and a located UTF-8
//! check, long values cut for messages, control characters escaped for observations.
//!
//! Also compiled into the static `engine` front (engine/front/lib.rs), which has this file and
//! `units.rs` alone of the library: use nothing else of the crate here.

use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest config, template or action file read (1 MiB): more is refused before parsing.
pub const MAX_INPUT_BYTES: u64 = 1 << 20;

/// Long values cut for messages: the sandbox crate's helper, the one of the workspace.
pub use sandbox::text_pos::{cut, SHOWN_CHARS};

/// Errors of reading an input file.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: larger than {max} bytes, the most an input file may be")]
    TooLarge { file: PathBuf, max: u64 },
    #[error("{file}:{line}:{column}: invalid UTF-8")]
    Utf8 {
        file: PathBuf,
        line: usize,
        column: usize,
    },
}

/// Read a text input file: at most [`MAX_INPUT_BYTES`], valid UTF-8 (an error names the line
/// and column of the first invalid byte).
pub fn read_input(file: &Path) -> Result<String, TextError> {
    let read = |source| TextError::Read {
        file: file.into(),
        source,
    };
    let f = std::fs::File::open(file).map_err(read)?;
    let mut bytes = Vec::new();
    f.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(TextError::TooLarge {
            file: file.into(),
            max: MAX_INPUT_BYTES,
        });
    }
    utf8(bytes, file)
}

/// Bytes as text; invalid UTF-8 is an error at its line and column.
pub fn utf8(bytes: Vec<u8>, file: &Path) -> Result<String, TextError> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.into_bytes();
        // The prefix before the first invalid byte is valid by definition.
        let prefix = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        let (line, column) = sandbox::text_pos::line_col(prefix, prefix.len());
        TextError::Utf8 {
            file: file.into(),
            line,
            column,
        }
    })
}

/// Text for an observation: control characters (NUL, ESC, DEL, C1 ...) become `\xNN` or
/// `\u{NNNN}`, a backslash before such an escape stays literal; tabs and newlines are kept.
pub fn escape_control(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn long_values_are_cut_and_say_their_length() {
        assert_eq!(cut("short"), "short");
        let long = "é".repeat(1 << 19);
        let c = cut(&long);
        assert!(c.starts_with(&"é".repeat(SHOWN_CHARS)), "{c}");
        assert!(c.ends_with("... (1048576 bytes)"), "{c}");
        assert!(c.len() < 200);
    }

    #[test]
    fn control_characters_are_escaped_tabs_and_newlines_kept() {
        assert_eq!(escape_control("a\tb\nc"), "a\tb\nc");
        assert_eq!(
            escape_control("a\0b\x1b[31mc\x7f"),
            "a\\x00b\\x1b[31mc\\x7f"
        );
        assert_eq!(escape_control("\r\u{85}\u{9c}"), "\\x0d\\x85\\x9c");
        assert_eq!(escape_control("ünïcode ok"), "ünïcode ok");
        assert!(matches!(escape_control("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn input_files_are_bounded_and_utf8_errors_located() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x.toml");
        std::fs::write(&f, b"a = 1\nb = \"\xff\"\n").unwrap();
        let e = read_input(&f).unwrap_err().to_string();
        assert_eq!(e, format!("{}:2:6: invalid UTF-8", f.display()));
        std::fs::write(&f, vec![b'#'; MAX_INPUT_BYTES as usize + 1]).unwrap();
        assert!(matches!(read_input(&f), Err(TextError::TooLarge { .. })));
        std::fs::write(&f, "ok = true\n").unwrap();
        assert_eq!(read_input(&f).unwrap(), "ok = true\n");
        let e = read_input(&d.path().join("none")).unwrap_err().to_string();
        assert!(e.contains("none: No such file"), "{e}");
    }
}
