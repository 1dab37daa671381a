//! Positions in TOML text, shared by the policy loaders so errors name the line and key.

/// 1-based line of a byte offset.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Key named by a serde/toml message (``missing field `why` ``, ``duplicate key `x` ``).
pub(crate) fn quoted_key(message: &str) -> Option<String> {
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
}
