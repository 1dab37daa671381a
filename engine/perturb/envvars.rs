//! The command environment: a drifted locale, HOME or TMPDIR unset or wrong, noisy variables
//! that change how common tools behave or what they print.

use super::fs::make_readonly;
use super::{Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::Builder;
use rand::seq::SliceRandom;
use rand::Rng;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![&LocaleDrift, &HomeWrong, &TmpdirWrong, &NoisyEnv]
}

fn set(b: &mut Builder, k: &str, v: &str) {
    b.runtime.env.insert(k.into(), Some(v.into()));
}

/// A path under `parent` that does not exist in the instance, named from `names` by the seed.
fn fresh_path(b: &Builder, parent: &str, names: &[&str], rng: &mut impl Rng) -> String {
    let name = names.choose(rng).copied().unwrap_or("x");
    let mut p = format!("{parent}/{name}");
    let mut n = 2;
    while b.exists(&p) {
        p = format!("{parent}/{name}{n}");
        n += 1;
    }
    p
}

// ---------------------------------------------------------------------------------------------
// locale-drift
// ---------------------------------------------------------------------------------------------

pub struct LocaleDrift;

static LOCALE_DRIFT: Info = Info {
    name: "locale-drift",
    family: Family::Environment,
    summary: "commands run under another locale: decimal commas, Turkish case rules, byte-wise \
              C collation, or a locale the system lacks (setlocale warnings, C fallback)",
    mechanism: "LANG and LC_ALL of the command environment; the locale data is not added, so a \
                locale missing from the base behaves as on a real system that lacks it",
    params: &[ParamSpec {
        name: "locale",
        kind: Kind::Choice(&[
            "de_DE.UTF-8",
            "tr_TR.UTF-8",
            "fr_FR.UTF-8",
            "ja_JP.UTF-8",
            "en_US.ISO-8859-1",
            "C",
            "POSIX",
        ]),
        default: "de_DE.UTF-8",
        realistic: "de_DE/fr_FR (decimal comma), tr_TR (dotless i), C/POSIX (no UTF-8)",
        help: "locale name",
    }],
};

/// Whether the base has data for a locale (C and POSIX are built in).
fn locale_present(b: &Builder, locale: &str) -> bool {
    if locale == "C" || locale == "POSIX" {
        return true;
    }
    let (lang, codeset) = locale.split_once('.').unwrap_or((locale, ""));
    let norm: String = codeset
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_lowercase();
    b.exists(&format!("/usr/lib/locale/{lang}.{norm}"))
        || b.exists("/usr/lib/locale/locale-archive")
}

impl Perturbation for LocaleDrift {
    fn info(&self) -> &'static Info {
        &LOCALE_DRIFT
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let locale = params.str("locale").to_string();
        set(b, "LANG", &locale);
        set(b, "LC_ALL", &locale);
        let note = if locale_present(b, &locale) {
            ""
        } else {
            " (no data for it in the base: programs warn and fall back to C)"
        };
        Ok(format!("LANG=LC_ALL={locale}{note}"))
    }
}

// ---------------------------------------------------------------------------------------------
// home-wrong
// ---------------------------------------------------------------------------------------------

pub struct HomeWrong;

static HOME_WRONG: Info = Info {
    name: "home-wrong",
    family: Family::Environment,
    summary: "HOME is unset, points nowhere, or points to a directory that cannot be written",
    mechanism: "the command environment's HOME: removed (unset), a path under /home that does \
                not exist (nonexistent), or a directory created under /home and mounted \
                read-only (unwritable: EROFS, for root too)",
    params: &[ParamSpec {
        name: "how",
        kind: Kind::Choice(&["unset", "nonexistent", "unwritable"]),
        default: "unset",
        realistic: "unset (cron, systemd units), nonexistent (a deleted user), unwritable \
                    (a read-only home on a shared mount)",
        help: "what is wrong with HOME",
    }],
};

const USERS: &[&str] = &[
    "deploy",
    "app",
    "jenkins",
    "svc-backup",
    "ubuntu",
    "builder",
];

impl Perturbation for HomeWrong {
    fn info(&self) -> &'static Info {
        &HOME_WRONG
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        match params.str("how") {
            "unset" => {
                b.runtime.env.insert("HOME".into(), None);
                Ok("HOME unset".into())
            }
            "nonexistent" => {
                let p = fresh_path(b, "/home", USERS, &mut rng);
                set(b, "HOME", &p);
                Ok(format!("HOME={p}, which does not exist"))
            }
            _ => {
                let p = fresh_path(b, "/home", USERS, &mut rng);
                b.mkdir(&p, 0o755)?;
                make_readonly(b, &p);
                set(b, "HOME", &p);
                Ok(format!("HOME={p}, mounted read-only"))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// tmpdir-wrong
// ---------------------------------------------------------------------------------------------

pub struct TmpdirWrong;

static TMPDIR_WRONG: Info = Info {
    name: "tmpdir-wrong",
    family: Family::Environment,
    summary: "TMPDIR points to a missing directory, a read-only one, or a regular file: \
              mktemp, sort, compilers and package tools fail",
    mechanism: "the command environment's TMPDIR: a path that does not exist (nonexistent), a \
                directory created in the layer and mounted read-only (unwritable), or a \
                regular file created in the layer (file)",
    params: &[ParamSpec {
        name: "how",
        kind: Kind::Choice(&["nonexistent", "unwritable", "file"]),
        default: "nonexistent",
        realistic: "nonexistent (a cleaned-up build dir), unwritable (read-only mount), file",
        help: "what is wrong with TMPDIR",
    }],
};

const TMP_NAMES: &[&str] = &["build-tmp", "ci-scratch", "tmp.old", "app-tmp", "spool-tmp"];

impl Perturbation for TmpdirWrong {
    fn info(&self) -> &'static Info {
        &TMPDIR_WRONG
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        let p = fresh_path(b, "/var/tmp", TMP_NAMES, &mut rng);
        let what = match params.str("how") {
            "nonexistent" => "does not exist",
            "unwritable" => {
                b.mkdir(&p, 0o1777)?;
                make_readonly(b, &p);
                "is mounted read-only"
            }
            _ => {
                b.write(&p, "", 0o644)?;
                "is a regular file"
            }
        };
        set(b, "TMPDIR", &p);
        Ok(format!("TMPDIR={p}, which {what}"))
    }
}

// ---------------------------------------------------------------------------------------------
// noisy-env
// ---------------------------------------------------------------------------------------------

pub struct NoisyEnv;

/// Variables found in real environments that change what common tools do or print, with
/// realistic values.
const NOISE: &[(&str, &[&str])] = &[
    // GNU tools stop permuting options (`ls dir -l`), df/du count 512-byte blocks.
    ("POSIXLY_CORRECT", &["1"]),
    (
        "TZ",
        &["America/New_York", "Asia/Kolkata", "UTC+5", "Europe/Berlin"],
    ),
    ("LC_NUMERIC", &["de_DE.UTF-8", "fr_FR.UTF-8"]),
    ("LC_COLLATE", &["C", "en_US.UTF-8"]),
    // `cd name` may go elsewhere and prints the directory.
    ("CDPATH", &["/tmp:/var", ".:/srv:/opt"]),
    // Sizes of df, du, ls -l.
    ("BLOCK_SIZE", &["human-readable", "1M", "512"]),
    ("TIME_STYLE", &["+%s", "full-iso", "+%d.%m.%Y %H:%M"]),
    ("QUOTING_STYLE", &["shell-always", "c", "escape"]),
    // ps truncates its lines to COLUMNS.
    ("COLUMNS", &["40", "60"]),
    // grep 3.8 warns that GREP_COLOR is obsolescent, on every call.
    ("GREP_COLOR", &["1;32", "01;31"]),
    ("GREP_COLORS", &["mt=01;31:fn=35", "ms=01;32"]),
    // gzip warns that GZIP is obsolescent (tar -z too).
    ("GZIP", &["-9", "--rsyncable"]),
    ("TAR_OPTIONS", &["--verbose", "--warning=all"]),
    ("LS_COLORS", &["rs=0:di=01;34:ln=01;36:ex=01;32", "di=1;33"]),
    ("CLICOLOR_FORCE", &["1"]),
    ("PAGER", &["less -R", "most"]),
    (
        "LD_LIBRARY_PATH",
        &["/opt/oracle/instantclient", "/usr/local/cuda/lib64"],
    ),
    ("PYTHONWARNINGS", &["default", "error::DeprecationWarning"]),
];

static NOISY_ENV: Info = Info {
    name: "noisy-env",
    family: Family::Environment,
    summary: "leftover variables change how common tools parse options, format sizes, times \
              and names, or add warnings to their output",
    mechanism: "`count` variables chosen by the seed from POSIXLY_CORRECT, TZ, LC_NUMERIC, \
                LC_COLLATE, CDPATH, BLOCK_SIZE, TIME_STYLE, QUOTING_STYLE, COLUMNS, GREP_COLOR, \
                GREP_COLORS, GZIP, TAR_OPTIONS, LS_COLORS, CLICOLOR_FORCE, PAGER, \
                LD_LIBRARY_PATH, PYTHONWARNINGS, each with a realistic value chosen by the seed, \
                set in the command environment",
    params: &[ParamSpec {
        name: "count",
        kind: Kind::Int { min: 1, max: 18 },
        default: "3",
        realistic: "1-5",
        help: "how many variables",
    }],
};

impl Perturbation for NoisyEnv {
    fn info(&self) -> &'static Info {
        &NOISY_ENV
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let count = (params.int("count").max(1) as usize).min(NOISE.len());
        let mut rng = b.rng(purpose);
        let picked: Vec<&(&str, &[&str])> = NOISE.choose_multiple(&mut rng, count).collect();
        let mut chosen: Vec<(&str, &str)> = picked
            .into_iter()
            .map(|(k, vs)| (*k, vs.choose(&mut rng).copied().unwrap_or("1")))
            .collect();
        chosen.sort_unstable();
        for (k, v) in &chosen {
            set(b, k, v);
        }
        Ok(chosen
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "))
    }
}
