//! What `FROM python:TAG` stands for without a local image ([`python_base`]): the Debian
//! suite with the Python the tag asks for, and the build step ([`PythonBase::step`]) that
//! makes that suite's minimal system the image (`docs/harbor.md`, the `FROM` list).

use super::dockerfile::{repository, tag, Instruction, Step};
use sandbox::debootstrap::Suite;

/// The Debian suites whose `python3` is a CPython minor version, oldest first (the order
/// [`python_base`] searches): `FROM python:3.13` without a local image is trixie with its own
/// `python3`.
pub(super) const DEBIAN_PYTHONS: &[(&str, &str)] = &[
    ("3.9", "bullseye"),
    ("3.11", "bookworm"),
    ("3.13", "trixie"),
];

/// The Debian suite the `python` images are built on when their tag names none (Docker
/// Hub's default since August 2025).
const PYTHON_IMAGES_SUITE: &str = "trixie";

/// What a `python` image has that a minimal Debian system lacks, from the suite's own archive,
/// and pytest: the runner the offline shims call where a test script would download one
/// (`docs/harbor.md`, "Offline operation"), as the `host` base brings it.
pub(super) const PYTHON_PACKAGES: &str =
    "python3 python3-pip python3-venv python-is-python3 python3-pytest";

/// What `FROM python:TAG` stands for without a local image: a Debian suite and the Python the
/// tag asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PythonBase {
    pub(super) suite: Suite,
    /// `3.13` of `python:3.13.1-slim`; `None` for `python:slim`, `python:3`, `latest`.
    asked: Option<String>,
    /// Whether the suite's `python3` is the version asked for (known for [`DEBIAN_PYTHONS`]).
    matches: bool,
    /// The suite the tag names (`-bookworm`), when it is one made here.
    named: Option<Suite>,
}

/// A version's `(major, minor)`: `3.13` is `(3, 13)`.
fn minor_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The [`PythonBase`] of a `python` image's name (tags as Docker Hub names them: `3.13`,
/// `3.13.1-slim`, `3.12-slim-bookworm`, `3-bookworm`, `3.14-rc-slim`, `slim`, `latest`): the
/// suite whose `python3` is the minor version asked for; for a version no suite ships, the
/// suite the tag names if its Python is not older, else the oldest suite with a newer Python
/// of the same major version (the one that breaks the fewest programs written for the version
/// asked), else the newest suite of that major version, else the suite the tag names, else
/// the images' own default (also for a tag without a minor version). `None` for
/// other images and for the variants that are not Debian (`alpine`, `windowsservercore`,
/// `nanoserver`). Other words (`buster`: a suite not made here) name nothing.
pub(super) fn python_base(image: &str) -> Option<PythonBase> {
    if repository(image) != "python" {
        return None;
    }
    let mut asked = None;
    let mut named = None;
    for (i, part) in tag(image).split('-').enumerate() {
        if ["alpine", "windowsservercore", "nanoserver"]
            .iter()
            .any(|v| part.starts_with(v))
        {
            return None;
        }
        if i == 0 && part.starts_with(|c: char| c.is_ascii_digit()) {
            let mut numbers = part.split('.');
            let major = numbers.next().unwrap_or_default();
            // `3.14.0rc1`: the minor version is what selects the suite.
            asked = numbers.next().and_then(|minor| {
                let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
                (!digits.is_empty()).then(|| format!("{major}.{digits}"))
            });
        } else if part.bytes().all(|b| b.is_ascii_lowercase()) {
            named = named.or_else(|| Suite::parse(part).ok());
        }
    }
    let suites: Vec<((u32, u32), Suite)> = DEBIAN_PYTHONS
        .iter()
        .filter_map(|(v, s)| Some((minor_version(v)?, Suite::parse(s).ok()?)))
        .collect();
    let wanted = asked.as_deref().and_then(minor_version);
    let python_of = |suite: &Suite| suites.iter().find(|(_, s)| s == suite).map(|(v, _)| *v);
    // Not older than asked, in the same major version.
    let enough = |v: (u32, u32)| wanted.is_none_or(|w| v.0 == w.0 && v >= w);
    let exact = suites.iter().find(|(v, _)| Some(*v) == wanted);
    let matches = exact.is_some();
    let suite = exact
        .map(|(_, s)| s.clone())
        .or_else(|| named.clone().filter(|n| python_of(n).is_some_and(enough)))
        .or_else(|| {
            let newer = suites.iter().find(|(v, _)| wanted.is_some() && enough(*v));
            newer.map(|(_, s)| s.clone())
        })
        .or_else(|| {
            let same_major = suites
                .iter()
                .rev()
                .find(|(v, _)| wanted.is_some_and(|w| v.0 == w.0));
            same_major.map(|(_, s)| s.clone())
        })
        .or_else(|| named.clone())
        .or_else(|| Suite::parse(PYTHON_IMAGES_SUITE).ok())?;
    Some(PythonBase {
        suite,
        asked,
        matches,
        named,
    })
}

impl PythonBase {
    /// The step that makes the suite's minimal system the image: its `python3`, pip, venv,
    /// `python` and pytest, from the suite's archive through the build network.
    pub(super) fn step(line: usize) -> Instruction {
        let script = format!(
            "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
             --no-install-recommends {PYTHON_PACKAGES} && rm -rf /var/lib/apt/lists/*"
        );
        Instruction {
            line,
            text: format!("RUN {script}"),
            step: Step::Run { script },
        }
    }

    /// How the Python compares with the one asked for, in words.
    pub(super) fn version_note(&self) -> String {
        let version = match (&self.asked, self.matches) {
            (Some(v), true) => format!("Python {v} as asked"),
            (Some(v), false) => format!(
                "Python {v} is in no Debian suite made here ({}): {}'s python3 instead",
                DEBIAN_PYTHONS
                    .iter()
                    .map(|(v, s)| format!("{v} {s}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.suite
            ),
            (None, _) => format!("{}'s python3", self.suite),
        };
        match &self.named {
            Some(n) if *n != self.suite => {
                format!("{version}; the tag's {n} has another Python")
            }
            _ => version,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tags_take_the_suite_with_their_python() {
        let base = |image: &str| {
            python_base(image).map(|p| (p.suite.name().to_string(), p.asked, p.matches))
        };
        let is = |suite: &str, asked: Option<&str>, matches: bool| {
            Some((suite.to_string(), asked.map(str::to_string), matches))
        };
        assert_eq!(base("python:3.13-slim"), is("trixie", Some("3.13"), true));
        assert_eq!(base("python:3.13.1"), is("trixie", Some("3.13"), true));
        assert_eq!(
            base("docker.io/library/python:3.11-slim-bookworm@sha256:ab"),
            is("bookworm", Some("3.11"), true)
        );
        assert_eq!(
            base("python:3.9-bullseye"),
            is("bullseye", Some("3.9"), true)
        );
        // The version decides over the suite the tag names: its tests run with that Python.
        assert_eq!(
            base("python:3.11-slim-trixie"),
            is("bookworm", Some("3.11"), true)
        );
        // A version no suite has: the suite the tag names if its Python is not older, else
        // the oldest with a newer Python of that major version, else the images' default.
        assert_eq!(
            base("python:3.12-slim-bookworm"),
            is("trixie", Some("3.12"), false)
        );
        assert_eq!(
            base("python:3.10-slim-bookworm"),
            is("bookworm", Some("3.10"), false)
        );
        assert_eq!(
            base("python:3.14-slim-bookworm"),
            is("trixie", Some("3.14"), false)
        );
        assert_eq!(base("python:2.7-slim"), is("trixie", Some("2.7"), false));
        assert_eq!(base("python:2.7-buster"), is("trixie", Some("2.7"), false));
        assert_eq!(
            base("python:2.7-bullseye"),
            is("bullseye", Some("2.7"), false)
        );
        assert_eq!(base("python:3.12-slim"), is("trixie", Some("3.12"), false));
        assert_eq!(base("python:3.10"), is("bookworm", Some("3.10"), false));
        assert_eq!(
            base("python:3.8-buster"),
            is("bullseye", Some("3.8"), false)
        );
        assert_eq!(
            base("python:3.14.0rc1-slim"),
            is("trixie", Some("3.14"), false)
        );
        assert_eq!(
            base("python:3.14-rc-slim"),
            is("trixie", Some("3.14"), false)
        );
        assert_eq!(base("python:3-slim"), is("trixie", None, false));
        assert_eq!(base("python"), is("trixie", None, false));
        assert_eq!(base("python:slim-bookworm"), is("bookworm", None, false));
        // A suite not made here names nothing: the version decides.
        assert_eq!(
            base("python:3.9-slim-buster"),
            is("bullseye", Some("3.9"), true)
        );
        assert_eq!(
            base("localhost:5000/python:3.13"),
            is("trixie", Some("3.13"), true)
        );
        // Not Debian, not python.
        assert_eq!(base("python:3.12-alpine3.20"), None);
        assert_eq!(base("python:3.12-windowsservercore-ltsc2022"), None);
        assert_eq!(base("python:3.12-nanoserver"), None);
        assert_eq!(base("debian:trixie"), None);
        assert!(python_base("python:3.13-slim-bookworm")
            .unwrap()
            .version_note()
            .ends_with("Python 3.13 as asked; the tag's bookworm has another Python"));
        assert!(python_base("python:3.12-slim")
            .unwrap()
            .version_note()
            .contains("Python 3.12 is in no Debian suite made here"));
    }
}
