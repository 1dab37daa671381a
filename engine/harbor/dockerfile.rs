//! The Dockerfile subset of task environments: logical lines (continuations, comments between
//! them, heredocs), the instructions that build a root filesystem, and positioned errors.
//!
//! Built: `FROM` (one stage), `RUN`, `COPY`/`ADD` (local sources, globs, heredocs, `--chown`,
//! `--chmod`), `WORKDIR`, `ENV`, `USER`, `ARG`. Recorded and ignored (they do not change the
//! files an episode sees): `LABEL`, `EXPOSE`, `CMD`, `ENTRYPOINT`, `MAINTAINER`, `STOPSIGNAL`,
//! `HEALTHCHECK`, `VOLUME`. Anything else is [`DockerfileError::Unsupported`].

use std::collections::BTreeMap;

/// Errors of one Dockerfile, each with its line.
#[derive(Debug, thiserror::Error)]
pub enum DockerfileError {
    #[error("line {line}: {reason}")]
    Syntax { line: usize, reason: String },
    #[error("line {line}: unsupported: {what}")]
    Unsupported { line: usize, what: String },
}

/// A source of `COPY`/`ADD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A path (or glob) relative to the build context.
    Path(String),
    /// An inline file: the heredoc's name is the destination's file name.
    Heredoc { name: String, body: String },
}

/// One build instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Run {
        script: String,
    },
    Copy {
        sources: Vec<Source>,
        dest: String,
        chown: Option<String>,
        chmod: Option<u32>,
    },
    Workdir(String),
    Env(Vec<(String, String)>),
    User(String),
    Arg(String, Option<String>),
    /// An instruction without effect on the files (its keyword).
    Ignored(String),
}

/// One instruction with its line and its text (the cache key's part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub line: usize,
    pub text: String,
    pub step: Step,
}

/// A parsed Dockerfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The base image as written (after `ARG` substitution).
    pub from: String,
    pub from_line: usize,
    pub steps: Vec<Instruction>,
}

/// An image name's repository: `python` of `docker.io/library/python:3.11-slim`.
pub fn repository(image: &str) -> &str {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split([':', '@']).next().unwrap_or(name)
}

/// An image name's tag (`latest` when it has none; a digest is dropped).
pub fn tag(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map_or("latest", |(_, t)| t)
}

/// A logical line: its first physical line, keyword, arguments, heredoc bodies.
struct Logical {
    line: usize,
    keyword: String,
    args: String,
    heredocs: Vec<(String, String)>,
}

fn logical_lines(text: &str) -> Result<Vec<Logical>, DockerfileError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let first = lines[i].trim();
        if first.is_empty() || first.starts_with('#') {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut joined = String::new();
        loop {
            let l = lines[i].trim_end();
            i += 1;
            if let Some(body) = l.strip_suffix('\\') {
                joined.push_str(body);
                joined.push(' ');
                // Comment lines and empty lines inside a continuation are dropped.
                while i < lines.len() {
                    let t = lines[i].trim();
                    if t.starts_with('#') || t.is_empty() {
                        i += 1;
                    } else {
                        break;
                    }
                }
                if i >= lines.len() {
                    return Err(DockerfileError::Syntax {
                        line: start,
                        reason: "the file ends inside a line continuation".into(),
                    });
                }
            } else {
                joined.push_str(l);
                break;
            }
        }
        let joined = joined.trim().to_string();
        let (keyword, args) = match joined.split_once(char::is_whitespace) {
            Some((k, a)) => (k.to_ascii_uppercase(), a.trim().to_string()),
            None => (joined.to_ascii_uppercase(), String::new()),
        };
        // Heredocs: every `<<[-]NAME` (quoted or not) takes the following lines up to NAME.
        let mut heredocs = Vec::new();
        for name in heredoc_names(&args) {
            let (strip_tabs, name) = match name.strip_prefix('-') {
                Some(n) => (true, n.to_string()),
                None => (false, name),
            };
            let name = name.trim_matches(|c| c == '"' || c == '\'').to_string();
            let mut body = String::new();
            loop {
                if i >= lines.len() {
                    return Err(DockerfileError::Syntax {
                        line: start,
                        reason: format!("heredoc `{name}` is not closed"),
                    });
                }
                let l = lines[i];
                i += 1;
                let l = if strip_tabs {
                    l.trim_start_matches('\t')
                } else {
                    l
                };
                if l == name {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            heredocs.push((name, body));
        }
        out.push(Logical {
            line: start,
            keyword,
            args,
            heredocs,
        });
    }
    Ok(out)
}

/// The `NAME`s of `<<NAME` / `<<-NAME` / `<<"NAME"` words of an instruction.
fn heredoc_names(args: &str) -> Vec<String> {
    args.split_whitespace()
        .filter_map(|w| w.strip_prefix("<<"))
        .filter(|n| {
            let n = n
                .trim_start_matches('-')
                .trim_matches(|c| c == '"' || c == '\'');
            !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(str::to_string)
        .collect()
}

/// `$NAME` and `${NAME}` replaced from `vars` (unknown names become empty, as in Docker).
pub fn substitute(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < b.len() {
        if b[i] == '\\' && i + 1 < b.len() && b[i + 1] == '$' {
            out.push('$');
            i += 2;
            continue;
        }
        if b[i] == '$' && i + 1 < b.len() {
            let (name, next) = if b[i + 1] == '{' {
                match b[i + 2..].iter().position(|&c| c == '}') {
                    Some(end) => {
                        let inner: String = b[i + 2..i + 2 + end].iter().collect();
                        // ${NAME:-default}
                        let (n, default) = match inner.split_once(":-") {
                            Some((n, d)) => (n.to_string(), Some(d.to_string())),
                            None => (inner, None),
                        };
                        let v = vars.get(&n).cloned().filter(|v| !v.is_empty());
                        out.push_str(&v.or(default).unwrap_or_default());
                        i = i + 3 + end;
                        continue;
                    }
                    None => (String::new(), i + 1),
                }
            } else {
                let n: String = b[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                    .collect();
                let next = i + 1 + n.chars().count();
                (n, next)
            };
            if name.is_empty() {
                out.push('$');
                i += 1;
            } else {
                out.push_str(vars.get(&name).map_or("", String::as_str));
                i = next;
            }
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A JSON array form (`["a", "b"]`), if the arguments are one.
fn json_array(args: &str, line: usize) -> Result<Option<Vec<String>>, DockerfileError> {
    if !args.starts_with('[') {
        return Ok(None);
    }
    match serde_json::from_str::<Vec<String>>(args) {
        Ok(v) => Ok(Some(v)),
        Err(e) => Err(DockerfileError::Syntax {
            line,
            reason: format!("not a JSON array of strings: {e}"),
        }),
    }
}

/// Words split on whitespace, with double and single quotes kept together.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                any = true;
            }
            None if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            None => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn parse_env(args: &str, line: usize) -> Result<Vec<(String, String)>, DockerfileError> {
    let w = words(args);
    if w.is_empty() {
        return Err(DockerfileError::Syntax {
            line,
            reason: "ENV needs a name and a value".into(),
        });
    }
    if !w[0].contains('=') {
        // `ENV NAME value with spaces`
        let (name, value) = args.split_once(char::is_whitespace).unwrap_or((args, ""));
        let v = words(value).join(" ");
        return Ok(vec![(name.to_string(), v)]);
    }
    w.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(DockerfileError::Syntax {
                line,
                reason: format!("`{kv}` is not NAME=VALUE"),
            }),
        })
        .collect()
}

/// Parse a Dockerfile. `ARG`s before `FROM` and `ENV`s are substituted into later
/// instructions' paths; `RUN` scripts see them as environment variables instead.
pub fn parse(text: &str) -> Result<Dockerfile, DockerfileError> {
    let mut from: Option<(String, usize)> = None;
    let mut steps = Vec::new();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for l in logical_lines(text)? {
        let line = l.line;
        let unsupported = |what: String| DockerfileError::Unsupported { line, what };
        let text = format!("{} {}", l.keyword, l.args);
        let step = match l.keyword.as_str() {
            "FROM" => {
                if from.is_some() {
                    return Err(unsupported(
                        "a second FROM (multi-stage builds are not supported)".into(),
                    ));
                }
                let w: Vec<String> = words(&l.args)
                    .into_iter()
                    .filter(|w| !w.starts_with("--platform"))
                    .collect();
                match w.as_slice() {
                    [image] => from = Some((substitute(image, &vars), line)),
                    [image, as_, _] if as_.eq_ignore_ascii_case("as") => {
                        from = Some((substitute(image, &vars), line))
                    }
                    _ => {
                        return Err(DockerfileError::Syntax {
                            line,
                            reason: "FROM takes one image (and an optional `AS name`)".into(),
                        })
                    }
                }
                continue;
            }
            "ARG" => {
                let w = words(&l.args);
                let [spec] = w.as_slice() else {
                    return Err(DockerfileError::Syntax {
                        line,
                        reason: "ARG takes one NAME or NAME=default".into(),
                    });
                };
                let (name, default) = match spec.split_once('=') {
                    Some((n, d)) => (n.to_string(), Some(d.to_string())),
                    None => (spec.clone(), None),
                };
                vars.entry(name.clone())
                    .or_insert_with(|| default.clone().unwrap_or_default());
                if from.is_none() {
                    continue;
                }
                Step::Arg(name, default)
            }
            _ if from.is_none() => {
                return Err(DockerfileError::Syntax {
                    line,
                    reason: format!("{} before FROM", l.keyword),
                })
            }
            "RUN" => {
                if l.args.starts_with("--") {
                    return Err(unsupported(format!(
                        "RUN options ({})",
                        l.args.split_whitespace().next().unwrap_or_default()
                    )));
                }
                let script = if let Some(argv) = json_array(&l.args, line)? {
                    argv.iter()
                        .map(|a| crate::instance::sh_quote(a))
                        .collect::<Vec<_>>()
                        .join(" ")
                } else if let [(_, body)] = l.heredocs.as_slice() {
                    // `RUN <<EOF` (optionally `RUN bash <<EOF`): the body is the script.
                    let before = l.args.split("<<").next().unwrap_or_default().trim();
                    if before.is_empty() {
                        body.clone()
                    } else {
                        format!("{before} <<'ENVFACTORY_EOF'\n{body}ENVFACTORY_EOF\n")
                    }
                } else if l.heredocs.len() > 1 {
                    return Err(unsupported("RUN with more than one heredoc".into()));
                } else {
                    l.args.clone()
                };
                if script.trim().is_empty() {
                    return Err(DockerfileError::Syntax {
                        line,
                        reason: "RUN without a command".into(),
                    });
                }
                Step::Run { script }
            }
            "COPY" | "ADD" => parse_copy(&l, &vars)?,
            "WORKDIR" => {
                let d = substitute(l.args.trim(), &vars);
                if d.is_empty() {
                    return Err(DockerfileError::Syntax {
                        line,
                        reason: "WORKDIR without a path".into(),
                    });
                }
                Step::Workdir(d)
            }
            "ENV" => {
                let kvs: Vec<(String, String)> = parse_env(&l.args, line)?
                    .into_iter()
                    .map(|(k, v)| (k, substitute(&v, &vars)))
                    .collect();
                for (k, v) in &kvs {
                    vars.insert(k.clone(), v.clone());
                }
                Step::Env(kvs)
            }
            "USER" => {
                let u = substitute(l.args.trim(), &vars);
                if u.is_empty() || u.contains(char::is_whitespace) {
                    return Err(DockerfileError::Syntax {
                        line,
                        reason: "USER takes one user (name or uid, optionally :group)".into(),
                    });
                }
                Step::User(u)
            }
            "LABEL" | "EXPOSE" | "CMD" | "ENTRYPOINT" | "MAINTAINER" | "STOPSIGNAL"
            | "HEALTHCHECK" | "VOLUME" => Step::Ignored(l.keyword.clone()),
            other => return Err(unsupported(format!("the {other} instruction"))),
        };
        steps.push(Instruction { line, text, step });
    }
    let Some((from, from_line)) = from else {
        return Err(DockerfileError::Syntax {
            line: 1,
            reason: "no FROM instruction".into(),
        });
    };
    Ok(Dockerfile {
        from,
        from_line,
        steps,
    })
}

fn parse_copy(l: &Logical, vars: &BTreeMap<String, String>) -> Result<Step, DockerfileError> {
    let line = l.line;
    let mut chown = None;
    let mut chmod = None;
    let mut rest: Vec<String> = Vec::new();
    let args = if let Some(argv) = json_array(&l.args, line)? {
        argv
    } else {
        words(&l.args)
    };
    for w in args {
        if let Some(v) = w.strip_prefix("--chown=") {
            chown = Some(substitute(v, vars));
        } else if let Some(v) = w.strip_prefix("--chmod=") {
            chmod = Some(
                u32::from_str_radix(v, 8).map_err(|_| DockerfileError::Syntax {
                    line,
                    reason: format!("--chmod={v} is not an octal mode"),
                })?,
            );
        } else if w.starts_with("--") && rest.is_empty() {
            return Err(DockerfileError::Unsupported {
                line,
                what: format!("{} {w}", l.keyword),
            });
        } else {
            rest.push(w);
        }
    }
    if rest.len() < 2 {
        return Err(DockerfileError::Syntax {
            line,
            reason: format!("{} needs a source and a destination", l.keyword),
        });
    }
    let dest = substitute(&rest.pop().unwrap_or_default(), vars);
    let mut heredocs = l.heredocs.iter();
    let mut sources = Vec::new();
    for s in rest {
        if s.starts_with("<<") {
            let Some((name, body)) = heredocs.next() else {
                return Err(DockerfileError::Syntax {
                    line,
                    reason: format!("heredoc `{s}` has no body"),
                });
            };
            sources.push(Source::Heredoc {
                name: name.clone(),
                body: body.clone(),
            });
            continue;
        }
        let s = substitute(&s, vars);
        if s.contains("://") {
            return Err(DockerfileError::Unsupported {
                line,
                what: format!("{} of a URL ({s}): builds are offline", l.keyword),
            });
        }
        if l.keyword == "ADD"
            && [".tar", ".tgz", ".tar.gz", ".tar.xz"]
                .iter()
                .any(|x| s.ends_with(x))
        {
            return Err(DockerfileError::Unsupported {
                line,
                what: format!("ADD of an archive ({s}): its automatic extraction"),
            });
        }
        sources.push(Source::Path(s));
    }
    Ok(Step::Copy {
        sources,
        dest,
        chown,
        chmod,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn continuations_comments_and_heredocs() {
        let d = parse(
            "# syntax=docker/dockerfile:1\nARG BASE=debian:bookworm\nFROM $BASE\n\
             RUN apt-get update && \\\n    # a comment between\n    apt-get install -y curl\n\
             COPY --chmod=755 <<EOF /usr/local/bin/hi\n#!/bin/sh\necho hi\nEOF\n\
             ENV A=1 B=\"two words\"\nWORKDIR /app/$A\nCMD [\"sh\"]\n",
        )
        .unwrap();
        assert_eq!(d.from, "debian:bookworm");
        assert_eq!(d.from_line, 3);
        assert_eq!(
            d.steps[0].step,
            Step::Run {
                script: "apt-get update &&      apt-get install -y curl".into()
            }
        );
        assert_eq!(d.steps[0].line, 4);
        assert_eq!(
            d.steps[1].step,
            Step::Copy {
                sources: vec![Source::Heredoc {
                    name: "EOF".into(),
                    body: "#!/bin/sh\necho hi\n".into()
                }],
                dest: "/usr/local/bin/hi".into(),
                chown: None,
                chmod: Some(0o755)
            }
        );
        assert_eq!(
            d.steps[2].step,
            Step::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into())
            ])
        );
        assert_eq!(d.steps[3].step, Step::Workdir("/app/1".into()));
        assert_eq!(d.steps[4].step, Step::Ignored("CMD".into()));
    }

    #[test]
    fn bad_input_names_the_line() {
        let e = parse("FROM a\nRUN true\nFROM b\n").unwrap_err().to_string();
        assert!(e.starts_with("line 3: unsupported: a second FROM"), "{e}");
        let e = parse("FROM a\nSHELL [\"bash\"]\n").unwrap_err().to_string();
        assert_eq!(e, "line 2: unsupported: the SHELL instruction");
        let e = parse("RUN true\n").unwrap_err().to_string();
        assert_eq!(e, "line 1: RUN before FROM");
        let e = parse("FROM a\nRUN echo \\\n").unwrap_err().to_string();
        assert!(
            e.contains("line 2: the file ends inside a line continuation"),
            "{e}"
        );
        let e = parse("FROM a\nCOPY --from=build /x /y\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: unsupported: COPY --from=build"), "{e}");
        let e = parse("FROM a\nRUN <<EOF\ntrue\n").unwrap_err().to_string();
        assert!(e.contains("heredoc `EOF` is not closed"), "{e}");
        let e = parse("FROM a\nADD https://x/y /y\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported: ADD of a URL"), "{e}");
        assert!(parse("# nothing\n")
            .unwrap_err()
            .to_string()
            .contains("no FROM"));
    }
}
