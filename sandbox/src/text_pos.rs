//! Positions in text, for errors that name a line (and column) and a key: the policy loaders
//! here, and any caller with a byte offset into a config file (a TOML span, a parser's error).

/// 1-based line of a byte offset (past the end: the last line).
pub fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// 1-based (line, column) of a byte offset; the column counts characters, not bytes. The
/// offset is clamped to the text, then moved back to the start of the character it falls in.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line_of(text, end), before[line_start..].chars().count() + 1)
}

/// Characters of a value shown in a message before it is cut.
pub const SHOWN_CHARS: usize = 80;

/// `s` for a message: whole when short, else its first [`SHOWN_CHARS`] characters and how
/// long it was (a megabyte of input never makes a megabyte of error).
pub fn cut(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => std::borrow::Cow::Borrowed(s),
        Some((i, _)) => std::borrow::Cow::Owned(format!("{}... ({} bytes)", &s[..i], s.len())),
    }
}

/// Key named by a serde/toml message (``missing field `why` ``, ``duplicate key `x` ``).
pub fn quoted_key(message: &str) -> Option<String> {
    ["field `", "key `"].iter().find_map(|marker| {
        let start = message.find(marker)? + marker.len();
        let len = message[start..].find('`')?;
        Some(message[start..start + len].to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_keys() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
        assert_eq!(quoted_key("missing field `why`").as_deref(), Some("why"));
        assert_eq!(
            quoted_key("duplicate key `x` in table").as_deref(),
            Some("x")
        );
        assert_eq!(quoted_key("no key here"), None);
    }

    #[test]
    fn columns_count_characters_from_the_start_of_the_line() {
        let text = "ab\ncd";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 1), (1, 2));
        assert_eq!(line_col(text, 2), (1, 3), "the newline itself ends line 1");
        assert_eq!(line_col(text, 3), (2, 1));
        assert_eq!(line_col(text, 4), (2, 2));
        assert_eq!(line_col("", 0), (1, 1));
    }

    #[test]
    fn columns_after_multi_byte_characters() {
        // "é" is 2 bytes, "→" 3, "🦀" 4: each is one column.
        let text = "x = \"é→🦀\" # c\nnext";
        let at = |needle: &str| text.find(needle).unwrap();
        assert_eq!(line_col(text, at("é")), (1, 6));
        assert_eq!(line_col(text, at("→")), (1, 7));
        assert_eq!(line_col(text, at("🦀")), (1, 8));
        assert_eq!(line_col(text, at("\" #")), (1, 9));
        assert_eq!(line_col(text, at("# c")), (1, 11));
        assert_eq!(line_col(text, at("next")), (2, 1));
        // An offset inside a character counts as that character's start.
        assert_eq!(line_col(text, at("🦀") + 2), (1, 8));
        assert_eq!(line_col(text, at("é") + 1), (1, 6));
    }

    #[test]
    fn offsets_at_or_past_the_end_are_clamped() {
        let text = "ab\nc🦀";
        assert_eq!(line_col(text, text.len()), (2, 3));
        assert_eq!(line_col(text, text.len() + 10), (2, 3));
        assert_eq!(line_col(text, usize::MAX), (2, 3));
        assert_eq!(line_col("ab\n", 3), (2, 1), "after a final newline");
        assert_eq!(line_of(text, usize::MAX), 2);
    }
}
