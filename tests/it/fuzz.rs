//! A bounded fuzz run of every input parser: templates (TOML and YAML), experiment configs,
//! action files and fault specs, mutated from the shipped examples with a dictionary of
//! boundary values (huge numbers, NaN, nulls, aliases, deep nesting, control bytes). No input
//! may panic; whatever parses must also sample. `ENVFACTORY_FUZZ_ITERS` sets the mutations
//! per target (default 1500, which CI runs in a few seconds).

use rand::{Rng, SeedableRng};
use std::path::Path;

const DICT: &[&str] = &[
    "*a",
    "&a ",
    "*b",
    "&b ",
    "<<: *a",
    "[",
    "]",
    "{",
    "}",
    ":",
    ": ",
    "\n",
    "\n  ",
    "  - ",
    "~",
    "null",
    "nan",
    ".nan",
    "inf",
    "-.inf",
    "1e999",
    "-1",
    "0",
    "18446744073709551615",
    "9223372036854775808",
    "99999999999999999999s",
    "0.0001ms",
    "1024T",
    "1025T",
    "\"",
    "'",
    "#",
    "=",
    ",",
    "\0",
    "\u{1b}[31m",
    "é",
    "🦀",
    "@",
    "@99999999999999999999",
    "probability",
    "params",
    "name",
    "tool-missing",
    "disk-fill",
    "tool=",
    "free_pct=",
    ":tool=tar",
    "[[perturbation_space]]",
    "[reward]",
    "goal = ",
    "step_timeout = ",
    "episodes = ",
];

fn iterations() -> usize {
    std::env::var("ENVFACTORY_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}

/// A mutation of `seed`: dictionary insertions, deletions and duplications at char
/// boundaries.
fn mutate(rng: &mut impl Rng, seed: &str) -> String {
    let mut s = seed.to_string();
    for _ in 0..rng.gen_range(1..6) {
        let at = |s: &str, rng: &mut dyn rand::RngCore| {
            let n = s.len();
            let mut i = rng.gen_range(0..=n);
            while !s.is_char_boundary(i) {
                i -= 1;
            }
            i
        };
        match rng.gen_range(0..4) {
            0 | 1 => {
                let i = at(&s, rng);
                s.insert_str(i, DICT[rng.gen_range(0..DICT.len())]);
            }
            2 => {
                let (a, b) = (at(&s, rng), at(&s, rng));
                s.replace_range(a.min(b)..a.max(b), "");
            }
            _ => {
                let (a, b) = (at(&s, rng), at(&s, rng));
                let piece = s[a.min(b)..a.max(b)].to_string();
                let i = at(&s, rng);
                s.insert_str(i, &piece.repeat(rng.gen_range(1..4)));
            }
        }
    }
    s
}

/// Run `parse` on mutations of each seed; a panic names the input that caused it.
fn fuzz(target: &str, seeds: &[String], parse: impl Fn(&str)) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(target.len() as u64 * 7919);
    for i in 0..iterations() {
        let input = mutate(&mut rng, &seeds[i % seeds.len()]);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(&input))).is_err() {
            panic!("{target}: panic on input {input:?}");
        }
    }
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

#[test]
fn templates_never_panic() {
    use engine::template::{Format, Template};
    let toml = vec![
        read("templates/archive-logs.toml"),
        read("templates/ops-mix.toml"),
    ];
    let yaml = vec![read("templates/archive-logs.yaml")];
    let check = |format: Format, file: &'static str| {
        move |text: &str| {
            if let Ok(t) = Template::parse(text, Path::new(file), format) {
                for p in t.sample_many(0, 3) {
                    let _ = engine::instance::instance_id(&p, "base");
                }
            }
        }
    };
    fuzz("toml templates", &toml, check(Format::Toml, "t.toml"));
    fuzz("yaml templates", &yaml, check(Format::Yaml, "t.yaml"));
}

#[test]
fn experiment_configs_never_panic() {
    let seeds = vec![
        "[experiment]\nname = \"f\"\nseeds = [1, 2]\n[environment]\ntask = \"archive-logs\"\nepisodes = 3\nstep_timeout = \"2s\"\n[reward]\ngoal = 5.0\n".to_string(),
        read("experiments/ppo-clean.toml"),
        read("experiments/rarl.toml"),
    ];
    // Named as the shipped files are, so their templates resolve against the project root.
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/fuzz.toml");
    fuzz("experiment configs", &seeds, |text| {
        if let Ok(e) = engine::experiment::Experiment::parse(text, &file) {
            let _ = e.env_config();
            let _ = e.plan(
                e.experiment.seeds[0],
                e.environment.episodes.saturating_sub(1),
            );
        }
    });
}

#[test]
fn action_files_and_fault_specs_never_panic() {
    let actions = vec!["# a plan\n@0\nls -la /var/log\n\n@3\n".to_string()];
    fuzz("action files", &actions, |text| {
        let _ = engine::actions::parse(text, Path::new("a.txt"));
    });
    let specs: Vec<String> = [
        "tool-missing:tool=tar",
        "disk-fill:free_pct=5",
        "clock-skew",
        "path-shadow:tool=gzip",
    ]
    .map(String::from)
    .to_vec();
    fuzz("fault specs", &specs, |text| {
        let _ = engine::perturb::parse_spec(text);
    });
}

/// `engine serve`'s frames: every mutation parses or is refused with a protocol error code
/// and a message; what parses as a reset also resolves to a plan or a refusal.
#[test]
fn serve_frames() {
    use engine::serve::protocol::{parse_message, Incoming};
    let seeds: Vec<String> = [
        r#"{"type":"reset","data":{"task":"archive-logs","seed":3,"perturbations":["tool-missing:tool=tar",{"name":"disk-fill","params":{"free_pct":"0"}}],"episode_id":"e"}}"#,
        r#"{"type":"reset","data":{"template":"archive-logs","seed":18446744073709551615,"features":false}}"#,
        r#"{"type":"step","data":{"command":"ls -la /","metadata":{"k":[1,2]}}}"#,
        r#"{"type":"step","data":{"index":7}}"#,
        r#"{"type":"state"}"#,
        r#"{"type":"close"}"#,
        r#"{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"id"}}}}"#,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    fuzz("serve frames", &seeds, |input| match parse_message(input) {
        Ok(Incoming::Reset(args)) => {
            if let Err(e) = args.plan(&templates, "archive-logs", 1) {
                assert!(!e.message.is_empty());
            }
        }
        Ok(_) => {}
        Err(e) => {
            assert!(!e.message.is_empty(), "{input:?}");
            assert!(!e.infra_failure, "{input:?}: a bad frame is the client's");
        }
    });
}
