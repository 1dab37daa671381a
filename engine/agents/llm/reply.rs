//! The reply format: the command is the first fenced block (```` ```sh ````, ```` ```bash ````,
//! ```` ```shell ```` or no language), and a reply of the one word `DONE` ends the episode.
//! Reasoning between `<think>` and `</think>` is ignored.

/// What a reply asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Command(String),
    Done,
    /// No command in it; the reason, for the transcript and the correction sent back.
    Malformed(String),
}

/// Languages a fenced block may name and still be run by `sh -c`.
const SHELLS: [&str; 5] = ["", "sh", "bash", "shell", "console"];

/// Parse the text of a reply.
pub fn parse(content: &str) -> Reply {
    let text = strip_thinking(content);
    if let Some((lang, body)) = first_block(&text) {
        if !SHELLS.contains(&lang.as_str()) {
            return Reply::Malformed(format!(
                "the first fenced block is `{}`, not a shell command (```sh)",
                crate::text::cut(&lang)
            ));
        }
        let cmd = body.trim();
        if cmd.is_empty() {
            return Reply::Malformed("the fenced block is empty".into());
        }
        return Reply::Command(cmd.to_string());
    }
    let word = text.trim().trim_end_matches(['.', '!']);
    if word.eq_ignore_ascii_case("done") {
        return Reply::Done;
    }
    if text.trim().is_empty() {
        return Reply::Malformed("the reply is empty".into());
    }
    Reply::Malformed("no fenced ```sh block and not DONE".into())
}

/// The text without `<think>...</think>` spans (an unclosed one hides the rest).
fn strip_thinking(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("<think>") {
        out.push_str(&rest[..i]);
        match rest[i..].find("</think>") {
            Some(j) => rest = &rest[i + j + "</think>".len()..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// The language (lowercase) and body of the first complete fenced block, if any.
fn first_block(s: &str) -> Option<(String, String)> {
    let mut lines = s.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let lang = info.trim().to_ascii_lowercase();
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                return Some((lang, body.join("\n")));
            }
            body.push(l);
        }
        // An unclosed block (a reply cut at max_tokens) is not a command.
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_shell_block_is_the_command() {
        let r = parse("I will list it.\n```sh\nls -la /var/log\n```\nthen\n```sh\nrm x\n```");
        assert_eq!(r, Reply::Command("ls -la /var/log".into()));
        assert_eq!(
            parse("```\ncd /srv &&\n  tar -czf a.tgz logs\n```"),
            Reply::Command("cd /srv &&\n  tar -czf a.tgz logs".into())
        );
        assert_eq!(
            parse("  ```BASH\necho hi\n  ```"),
            Reply::Command("echo hi".into())
        );
    }

    #[test]
    fn thinking_is_ignored_and_done_ends() {
        assert_eq!(
            parse("<think>```sh\nrm -rf /\n```</think>\n```sh\ntrue\n```"),
            Reply::Command("true".into())
        );
        assert_eq!(parse("DONE."), Reply::Done);
        assert_eq!(parse("<think>maybe</think> done"), Reply::Done);
    }

    #[test]
    fn replies_without_a_command_are_malformed() {
        for bad in [
            "",
            "I think we should list the files.",
            "```python\nprint(1)\n```",
            "```sh\n\n```",
            "```sh\nls",
            "<think>```sh\nls\n```",
        ] {
            assert!(matches!(parse(bad), Reply::Malformed(_)), "{bad:?}");
        }
    }
}
