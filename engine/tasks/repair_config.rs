//! `repair-config`: an application's INI configuration was corrupted (truncated, garbled
//! lines, a broken section header, a line without `=`, a duplicated key with a wrong value).
//! The intended configuration is the shipped example with a few values changed, and the
//! instruction names those values. The verifier parses the file itself, strictly, and checks
//! the syntax, every key's value, no duplicates and no unknown keys.

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Confirm, Probe, ProbeError};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub struct RepairConfig;

/// The largest configuration read (the intended one is well under 1 KiB).
const MAX_CONFIG: u64 = 1 << 20;

/// Sections -> keys -> values, in file order.
type Ini = Vec<(String, Vec<(String, String)>)>;

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    path: String,
    example: String,
    /// The intended file's text (what the oracle writes).
    intended_text: String,
    /// section -> key -> value.
    intended: BTreeMap<String, BTreeMap<String, String>>,
    /// `section.key` -> value where the intended differs from the example.
    overrides: BTreeMap<String, String>,
    corruptions: Vec<String>,
}

fn render(app: &str, ini: &Ini) -> String {
    let mut s = format!("# {app} configuration\n");
    for (sec, kvs) in ini {
        s.push_str(&format!("\n[{sec}]\n"));
        for (k, v) in kvs {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s
}

fn generate(rng: &mut impl Rng, app: &str) -> Ini {
    let levels = ["debug", "info", "warn", "error"];
    let backends = ["memory", "redis", "memcached"];
    let mut all: Ini = vec![
        (
            "server".into(),
            vec![
                ("bind_host".into(), "127.0.0.1".into()),
                ("listen_port".into(), rng.gen_range(8000..9000).to_string()),
                ("workers".into(), rng.gen_range(2..17).to_string()),
                (
                    "request_timeout_s".into(),
                    rng.gen_range(5..120).to_string(),
                ),
            ],
        ),
        (
            "database".into(),
            vec![
                (
                    "db_host".into(),
                    format!("db{}.internal", rng.gen_range(1..5)),
                ),
                ("db_port".into(), rng.gen_range(5400..5500).to_string()),
                ("db_name".into(), format!("{app}_prod")),
                ("pool_size".into(), rng.gen_range(4..33).to_string()),
            ],
        ),
        (
            "cache".into(),
            vec![
                ("enabled".into(), pick(rng, &["true", "false"]).to_string()),
                ("backend".into(), pick(rng, &backends).to_string()),
                ("ttl_s".into(), rng.gen_range(30..3600).to_string()),
            ],
        ),
        (
            "logging".into(),
            vec![
                ("level".into(), pick(rng, &levels).to_string()),
                ("log_path".into(), format!("/var/log/{app}/{app}.log")),
                ("rotate_mb".into(), rng.gen_range(10..200).to_string()),
            ],
        ),
    ];
    // Three or four sections, in a seeded order after `server`.
    let keep = rng.gen_range(3..=4);
    let mut rest: Vec<_> = all.drain(1..).collect();
    rest.shuffle(rng);
    rest.truncate(keep - 1);
    all.extend(rest);
    all
}

/// A new value for a key, different from `old`.
fn other_value(rng: &mut impl Rng, key: &str, old: &str) -> String {
    loop {
        let v = match old.parse::<u32>() {
            Ok(n) => (n + rng.gen_range(1..50)).to_string(),
            Err(_) => match old {
                "true" => "false".into(),
                "false" => "true".into(),
                _ if key == "level" => pick(rng, &["debug", "info", "warn", "error"]).to_string(),
                _ if key == "backend" => pick(rng, &["memory", "redis", "memcached"]).to_string(),
                _ => format!("{old}-{}", util::token(rng, 3)),
            },
        };
        if v != old {
            return v;
        }
    }
}

/// One `key = value` of a section: (section, key, value).
pub type IniEntry = (String, String, String);

/// The whitespace the application's checker trims (perl's `\s` on bytes: space, tab, CR,
/// LF, VT, FF); nothing else, no Unicode spaces.
fn is_checker_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c)
}

fn trim_checker(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_checker_space(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_checker_space(*last) {
            break;
        }
        s = rest;
    }
    s
}

/// Strictly parse the INI text: `Err(line, reason)` on the first syntax error.
///
/// Bytes are read as the application's checker reads them (lines split at LF, only ASCII
/// whitespace trimmed, `[a-z_]` names), and more strictly: a value must be printable ASCII.
/// So every file accepted here is accepted by the checker with the same sections, keys and
/// values; a line a Unicode-aware trim would clean up (a no-break space, NEL) is an error.
pub fn parse_strict(text: &[u8]) -> Result<Vec<IniEntry>, (usize, String)> {
    let ident = |s: &[u8]| !s.is_empty() && s.iter().all(|&b| b.is_ascii_lowercase() || b == b'_');
    let show = |s: &[u8]| String::from_utf8_lossy(s).into_owned();
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        let line = trim_checker(raw);
        if line.is_empty() || line[0] == b'#' || line[0] == b';' {
            continue;
        }
        if let Some(rest) = line.strip_prefix(b"[") {
            let name = rest
                .strip_suffix(b"]")
                .ok_or((n, "unclosed section header".to_string()))?;
            if !ident(name) {
                return Err((n, format!("bad section name `{}`", show(name))));
            }
            section = Some(show(name));
            continue;
        }
        let eq = line
            .iter()
            .position(|&b| b == b'=')
            .ok_or((n, "not `key = value`".to_string()))?;
        let (k, v) = (trim_checker(&line[..eq]), trim_checker(&line[eq + 1..]));
        if !ident(k) {
            return Err((n, format!("bad key `{}`", show(k))));
        }
        if v.is_empty() || !v.iter().all(|&b| (0x20..0x7f).contains(&b)) {
            return Err((n, format!("bad value for `{}`", show(k))));
        }
        let sec = section
            .clone()
            .ok_or((n, "key outside of any section".to_string()))?;
        out.push((sec, show(k), show(v)));
    }
    Ok(out)
}

fn checker_script(app: &str) -> String {
    format!(
        r#"#!/usr/bin/perl
# {app}-check: validate the syntax of {app}'s configuration. Usage: {app}-check [FILE]
use strict;
use warnings;
my $f = shift // '/etc/{app}/{app}.ini';
open my $fh, '<', $f or die "{app}-check: cannot read $f: $!\n";
my ($sec, $bad, %seen) = (undef, 0);
while (my $l = <$fh>) {{
    chomp $l;
    $l =~ s/^\s+|\s+$//g;
    next if $l eq '' || $l =~ /^[#;]/;
    if ($l =~ /^\[([a-z_]+)\]$/) {{ $sec = $1; next }}
    if ($l =~ /^([a-z_]+)\s*=\s*(\S.*)$/ && defined $sec) {{
        print "$f:$.: duplicate key $1\n", $bad++ if $seen{{"$sec.$1"}}++;
        next;
    }}
    print "$f:$.: syntax error: $l\n";
    $bad++;
}}
print $bad ? "$f: $bad error(s)\n" : "$f: syntax OK\n";
exit($bad ? 1 : 0);
"#
    )
}

impl Task for RepairConfig {
    fn name(&self) -> &'static str {
        "repair-config"
    }

    fn summary(&self) -> &'static str {
        "restore a corrupted INI configuration to its intended values"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "repair-config");
        let app = *pick(&mut rng, util::APPS);
        let path = format!("/etc/{app}/{app}.ini");
        let example = format!("/usr/share/doc/{app}/{app}.ini.example");
        let defaults = generate(&mut rng, app);
        // Two or three values differ from the example.
        let mut intended = defaults.clone();
        let mut overrides = BTreeMap::new();
        let n_over = rng.gen_range(2..=3);
        while overrides.len() < n_over {
            let si = rng.gen_range(0..intended.len());
            let ki = rng.gen_range(0..intended[si].1.len());
            let (sec, kvs) = &mut intended[si];
            let (k, v) = &mut kvs[ki];
            let id = format!("{sec}.{k}");
            // Only numbers, switches and choices change (hosts, names and paths stay).
            let tunable = v.parse::<u32>().is_ok()
                || matches!(v.as_str(), "true" | "false")
                || matches!(k.as_str(), "level" | "backend");
            if !tunable || overrides.contains_key(&id) {
                continue;
            }
            *v = other_value(&mut rng, k, v);
            overrides.insert(id, v.clone());
        }
        let intended_text = render(app, &intended);
        let example_text = render(app, &defaults);

        // Corrupt the intended text.
        let mut lines: Vec<String> = intended_text.lines().map(str::to_string).collect();
        let kinds = ["garbled", "no-equals", "header", "duplicate", "truncated"];
        let mut chosen: Vec<&str> = kinds.choose_multiple(&mut rng, 2).copied().collect();
        chosen.sort();
        let key_lines: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains(" = "))
            .collect();
        let header_lines: Vec<usize> = (1..lines.len())
            .filter(|&i| lines[i].starts_with('[') && i > 2)
            .collect();
        let mut corruptions = Vec::new();
        for kind in &chosen {
            match *kind {
                "garbled" => {
                    let i = *pick(&mut rng, &key_lines);
                    corruptions.push(format!("garbled line {}", i + 1));
                    lines[i] = format!(
                        "{}\u{1b}[0m\u{7f}%#@!{}",
                        &lines[i][..3],
                        util::token(&mut rng, 5)
                    );
                }
                "no-equals" => {
                    let i = *pick(&mut rng, &key_lines);
                    corruptions.push(format!("`=` lost on line {}", i + 1));
                    lines[i] = lines[i].replacen(" = ", " ", 1);
                }
                "header" => {
                    let i = *pick(&mut rng, &header_lines);
                    corruptions.push(format!("broken header on line {}", i + 1));
                    lines[i] = lines[i].trim_end_matches(']').to_string();
                }
                "duplicate" => {
                    let i = *pick(&mut rng, &key_lines);
                    let (k, v) = lines[i].split_once(" = ").unwrap_or(("x", "1"));
                    let dup = format!("{k} = {}", other_value(&mut rng, k, v));
                    corruptions.push(format!("duplicated key after line {}", i + 1));
                    lines.insert(i + 1, dup);
                }
                _ => {
                    let keep = lines.len() - rng.gen_range(2..=4);
                    corruptions.push(format!("truncated after line {keep}"));
                    let last = lines[keep - 1].clone();
                    lines.truncate(keep - 1);
                    // Cut in the middle of the last kept line.
                    lines.push(last[..last.len() / 2].to_string());
                }
            }
        }
        let mut corrupted = lines.join("\n");
        if !chosen.contains(&"truncated") {
            corrupted.push('\n');
        }
        b.write(&path, corrupted.as_bytes(), 0o644)?;
        b.write(&example, example_text.as_bytes(), 0o644)?;
        let checker = format!("/usr/local/bin/{app}-check");
        b.write(&checker, checker_script(app).as_bytes(), 0o755)?;

        let mut map: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (s, kvs) in &intended {
            for (k, v) in kvs {
                map.entry(s.clone())
                    .or_default()
                    .insert(k.clone(), v.clone());
            }
        }
        let told: Vec<String> = overrides
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        let instruction = format!(
            "The configuration {path} of `{app}` is corrupted. Repair it so that it is valid INI \
             again ({checker} checks the syntax) with the intended values: those of the shipped \
             example {example}, except {}. No other keys, no duplicates.",
            told.join(", ")
        );
        let mut actions = vec![
            format!("cat -A {path}"),
            format!("cat {example}"),
            format!("{app}-check"),
            format!("diff {example} {path}"),
            format!("cp {example} {path}"),
            format!("cp {path} {path}.bak"),
            format!("rm -f {path}"),
            format!("cat {example} >> {path}"),
            format!("{app}-check {example}"),
            format!("ls -la /etc/{app}"),
        ];
        for (id, v) in &overrides {
            let key = id.split_once('.').map_or(id.as_str(), |(_, k)| k);
            actions.push(format!("sed -i 's|^{key} = .*|{key} = {v}|' {path}"));
        }
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: format!("/etc/{app}"),
            actions,
            action_costs: Vec::new(),
            keywords: util::words(&["cat", "cp", "sed", "diff", "ini", "check", "example", app]),
            max_steps: 30,
            facts: util::to_facts(&Facts {
                path,
                example,
                intended_text,
                intended: map,
                overrides,
                corruptions,
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let Some(text) = probe.read(&f.path, MAX_CONFIG + 1)? else {
            return Ok(Verdict::from_checks(vec![(
                false,
                format!("{} is not a regular file", f.path),
            )]));
        };
        // Past the limit the rest is unread, not absent: the file fails.
        if text.len() as u64 > MAX_CONFIG {
            return Ok(Verdict::from_checks(vec![(
                false,
                format!("{} is larger than {MAX_CONFIG} bytes", f.path),
            )]));
        }
        let entries = match parse_strict(&text) {
            Ok(e) => e,
            Err((line, reason)) => {
                return Ok(Verdict::from_checks(vec![(
                    false,
                    format!("{}:{line}: {reason}", f.path),
                )]))
            }
        };
        let mut checks = Vec::new();
        let mut seen: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (s, k, v) in entries {
            seen.entry((s, k)).or_default().push(v);
        }
        for (s, kvs) in &f.intended {
            for (k, want) in kvs {
                let got = seen.get(&(s.clone(), k.clone()));
                checks.push((
                    got.is_some_and(|g| g.len() == 1 && &g[0] == want),
                    match got {
                        None => format!("[{s}] {k} is missing"),
                        Some(g) if g.len() > 1 => format!("[{s}] {k} appears {} times", g.len()),
                        Some(g) => format!("[{s}] {k} = {} (want {want})", g[0]),
                    },
                ));
            }
        }
        let unknown: Vec<String> = seen
            .keys()
            .filter(|(s, k)| !f.intended.get(s).is_some_and(|m| m.contains_key(k)))
            .map(|(s, k)| format!("[{s}] {k}"))
            .collect();
        checks.push((
            unknown.is_empty(),
            format!("unknown keys: {}", unknown.join(", ")),
        ));
        Ok(Verdict::from_checks(checks))
    }

    /// The application's own checker, as shipped (its text, not the file the agent may have
    /// changed), run by the system's perl on the configuration: it must say `syntax OK`.
    /// Skipped only when the system has no perl at all (the reads above have decided).
    fn confirm(&self, setup: &TaskSetup, sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        if sys.stat("/usr/bin/perl")?.is_none() {
            return Ok(Verdict::from_checks(Vec::new()));
        }
        let app = f
            .path
            .rsplit_once('/')
            .map_or("", |(_, n)| n)
            .trim_end_matches(".ini");
        let r = sys.run(
            &format!(
                "/usr/bin/perl -e {} {} 2>&1",
                sh_quote(&checker_script(app)),
                sh_quote(&f.path)
            ),
            None,
            std::time::Duration::from_secs(10),
        )?;
        let said = String::from_utf8_lossy(&r.stdout);
        Ok(Verdict::from_checks(vec![(
            r.success() && said.contains("syntax OK"),
            format!(
                "the application's checker rejects {}: {}",
                f.path,
                said.lines().take(3).collect::<Vec<_>>().join("; ")
            ),
        )]))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let p = sh_quote(&f.path);
        vec![format!(
            "{CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&format!(
                "/bin/chmod u+w {p} 2>/dev/null; printf %s {} > {p}",
                sh_quote(&f.intended_text)
            ))
        )]
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        let app = f
            .path
            .rsplit_once('/')
            .map_or("", |(_, n)| n)
            .trim_end_matches(".ini")
            .to_string();
        let key_of = |id: &str| id.split_once('.').map_or(id, |(_, k)| k).to_string();
        let (key, value) = f
            .overrides
            .iter()
            .next()
            .map(|(id, v)| (key_of(id), v.clone()))
            .unwrap_or_default();
        let sed: Vec<String> = f
            .overrides
            .iter()
            .map(|(id, v)| {
                let k = key_of(id);
                format!("-e {}", sh_quote(&format!("s|^{k} = .*|{k} = {v}|")))
            })
            .collect();
        let perl: String = f
            .overrides
            .iter()
            .map(|(id, v)| {
                let k = key_of(id);
                format!("s|^{k} = .*|{k} = {v}|; ")
            })
            .collect();
        let overrides: Vec<String> = f
            .overrides
            .iter()
            .map(|(id, v)| sh_quote(&format!("{id}={v}")))
            .collect();
        [
            ("APP", app.clone()),
            ("PATH", sh_quote(&f.path)),
            ("EXAMPLE", sh_quote(&f.example)),
            ("CHECKER", format!("/usr/local/bin/{app}-check")),
            ("INTENDED", sh_quote(&f.intended_text)),
            ("KEY", key),
            ("VALUE", value),
            ("SED", sed.join(" ")),
            ("PERL", sh_quote(&perl)),
            ("OVERRIDES", overrides.join(" ")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parser_accepts_good_and_names_the_bad_line() {
        let ok = parse_strict(b"# c\n[a]\nx = 1\n\n[b_c]\ny_z = two words\n").unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[1], ("b_c".into(), "y_z".into(), "two words".into()));
        assert_eq!(parse_strict(b"[a]\nx 1\n").unwrap_err().0, 2);
        assert_eq!(parse_strict(b"[a\nx = 1\n").unwrap_err().0, 1);
        assert_eq!(parse_strict(b"x = 1\n").unwrap_err().0, 1);
        assert!(parse_strict(b"[a]\nx = \x1b[0m\n").is_err());
        // What the checker trims, and nothing else.
        assert_eq!(
            parse_strict(b"[a]\r\n\t x\t=\x0b1 \r\n").unwrap(),
            [("a".into(), "x".into(), "1".into())]
        );
        assert!(parse_strict("[a]\nx = 1\u{a0}\n".as_bytes()).is_err());
        assert!(parse_strict("[a]\n\u{85}x = 1\n".as_bytes()).is_err());
        assert!(parse_strict("[a]\n\u{a0}# not a comment to the checker\n".as_bytes()).is_err());
        assert_eq!(
            parse_strict("# réparé\n[a]\nx = 1\n".as_bytes())
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn generated_configs_parse_with_every_key() {
        for seed in 1..40 {
            let mut rng = crate::instance::rng_for(seed, "t");
            let ini = generate(&mut rng, "app");
            let text = render("app", &ini);
            assert_eq!(
                parse_strict(text.as_bytes()).unwrap().len(),
                ini.iter().map(|s| s.1.len()).sum::<usize>()
            );
        }
    }

    /// The strict parser against the application's own checker (run by the host's perl, its
    /// shipped text with one line added to print what it reads): for files mutated with
    /// every kind of whitespace and byte, whatever the parser accepts the checker accepts
    /// too, with the same sections, keys and values.
    #[test]
    fn whatever_the_parser_accepts_the_checker_reads_alike() {
        use rand::Rng;
        use std::io::Write;
        let shipped = checker_script("app");
        let anchor = "        print \"$f:$.: duplicate key $1\\n\"";
        assert!(
            shipped.contains(anchor),
            "the checker changed: update this test"
        );
        let tracer = shipped.replacen(
            anchor,
            &format!("        print \"V $sec.$1=$2\\n\";\n{anchor}"),
            1,
        );
        let dir = std::env::temp_dir().join(format!("ini-diff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("check.pl");
        std::fs::write(&script, tracer).unwrap();
        let base = render(
            "app",
            &generate(&mut crate::instance::rng_for(1, "t"), "app"),
        );
        let noise: &[&[u8]] = &[
            b" ",
            b"\t",
            b"\r",
            b"\x0b",
            b"\x0c",
            b"\n",
            b"=",
            b"#",
            b";",
            b"[",
            b"]",
            b"\0",
            b"\x7f",
            "\u{a0}".as_bytes(),
            "\u{85}".as_bytes(),
            "\u{3000}".as_bytes(),
            "\u{feff}".as_bytes(),
            b"\xff",
            b"A",
            b"_",
        ];
        let mut rng = crate::instance::rng_for(9, "ini-diff");
        let (mut accepted, mut tried) = (0, 0);
        for _ in 0..300 {
            let mut text = base.as_bytes().to_vec();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..=text.len());
                let n = noise[rng.gen_range(0..noise.len())];
                text.splice(at..at, n.iter().copied());
            }
            tried += 1;
            let Ok(entries) = parse_strict(&text) else {
                continue;
            };
            accepted += 1;
            let file = dir.join("app.ini");
            std::fs::File::create(&file)
                .unwrap()
                .write_all(&text)
                .unwrap();
            let out = std::process::Command::new("perl")
                .arg(&script)
                .arg(&file)
                .output()
                .expect("perl must be installed to test the parser against the checker");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && said.contains("syntax OK"),
                "the checker rejects what the parser took: {:?}\n{said}",
                String::from_utf8_lossy(&text)
            );
            let read: Vec<String> = said
                .lines()
                .filter_map(|l| l.strip_prefix("V "))
                .map(str::to_string)
                .collect();
            let ours: Vec<String> = entries
                .iter()
                .map(|(s, k, v)| format!("{s}.{k}={v}"))
                .collect();
            assert_eq!(ours, read, "{:?}", String::from_utf8_lossy(&text));
        }
        // Both sides were exercised.
        assert!(accepted > 30 && accepted < tried, "{accepted} of {tried}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
