//! `engine fingerprint`: an environment's feature vector, or a shipped reference one;
//! `engine fingerprint auc`: the realism classifier's held-out AUC, real set vs generated.

use clap::{Args, Subcommand};
use engine::realism::{self, AucOptions, Generated};
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FingerprintArgs {
    #[command(subcommand)]
    pub cmd: Option<FingerprintCmd>,
    /// `host`, a directory, or `oci:PATH`.
    #[arg(long, default_value = "host")]
    pub rootfs: String,
    /// A shipped fingerprint (`engine fingerprint auc` lists the real set's names).
    #[arg(long, conflicts_with_all = ["rootfs", "start"])]
    pub shipped: Option<String>,
    /// A shell command run in the sandbox before measuring (repeatable), e.g. one that starts
    /// a service: it must detach its daemon and should wait until it listens.
    #[arg(long)]
    pub start: Vec<String>,
    /// Print a data file (`{name, provenance, fingerprint}`) of this name instead.
    #[arg(long)]
    pub name: Option<String>,
    /// With `--name`: a JSON object merged into the provenance (suite, variant, packages, ...).
    #[arg(long, requires = "name")]
    pub provenance: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum FingerprintCmd {
    /// Train fresh realism classifiers on random splits of the shipped real set against
    /// generated instances (the templates' sampled plans, measured without their task) and
    /// report the held-out AUC with a 95% interval over the splits.
    Auc {
        /// Templates whose plans are measured (default: the shipped ones).
        #[arg(long = "template")]
        templates: Vec<PathBuf>,
        /// Seeds per template.
        #[arg(long, default_value_t = 40)]
        count: u64,
        /// First seed of the plans and of the splits.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 20)]
        splits: usize,
        /// Fraction of each class held out.
        #[arg(long, default_value_t = 0.3)]
        test_frac: f64,
        #[arg(long, default_value_t = 200)]
        epochs: usize,
        /// Put the plans on these root filesystems (round robin over the seeds) instead of
        /// the templates' own base: then only the faults tell them from real systems.
        #[arg(long = "base")]
        bases: Vec<String>,
        /// Read the generated fingerprints from this JSONL file (as `--save-generated`
        /// writes it) instead of measuring them.
        #[arg(long, conflicts_with = "save_generated")]
        generated: Option<PathBuf>,
        /// Write the generated fingerprints measured to this JSONL file.
        #[arg(long)]
        save_generated: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: FingerprintArgs) -> anyhow::Result<i32> {
    if let Some(FingerprintCmd::Auc {
        templates,
        count,
        seed,
        splits,
        test_frac,
        epochs,
        bases,
        generated,
        save_generated,
        json,
    }) = a.cmd
    {
        let opts = AucOptions {
            splits,
            test_frac,
            seed,
            epochs,
            ..AucOptions::default()
        };
        let gen = Generation {
            templates,
            count,
            bases,
            file: generated,
            save: save_generated,
        };
        return auc(gen, &opts, json);
    }
    let fp = match a.shipped {
        Some(name) => engine::fingerprint::shipped_fingerprint(&name)?,
        None => {
            let spec: sandbox::RootfsSpec = a.rootfs.parse()?;
            let rt = super::sandbox::runtime()?;
            engine::fingerprint::fingerprint_rootfs_started(&rt, &spec, &a.start)?
        }
    };
    if let Some(name) = a.name {
        let mut how = "engine fingerprint --rootfs ROOTFS".to_string();
        for s in &a.start {
            how.push_str(&format!(" --start {s:?}"));
        }
        let mut prov = engine::fingerprint::provenance(&a.rootfs, &how);
        if let Some(extra) = a.provenance {
            let extra: serde_json::Value = serde_json::from_str(&extra)
                .map_err(|e| anyhow::anyhow!("--provenance: not JSON: {e}"))?;
            let (Some(p), Some(x)) = (prov.as_object_mut(), extra.as_object()) else {
                anyhow::bail!("--provenance: not a JSON object");
            };
            p.extend(x.clone());
        }
        let v = serde_json::json!({"name": name, "provenance": prov, "fingerprint": fp});
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.json {
        outln!("{}", serde_json::to_string_pretty(&fp)?);
    } else {
        out!("{}", fp.text());
    }
    Ok(0)
}

/// Where the generated fingerprints come from.
struct Generation {
    templates: Vec<PathBuf>,
    count: u64,
    bases: Vec<String>,
    file: Option<PathBuf>,
    save: Option<PathBuf>,
}

fn auc(g: Generation, opts: &AucOptions, json: bool) -> anyhow::Result<i32> {
    let Generation {
        templates,
        count,
        bases,
        file: generated,
        save,
    } = g;
    let real = realism::real_set()?;
    let gen: Vec<Generated> = match generated {
        Some(file) => std::fs::read_to_string(&file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| anyhow::anyhow!("{}:{}: {e}", file.display(), i + 1))
            })
            .collect::<anyhow::Result<_>>()?,
        None => {
            let templates = if templates.is_empty() {
                vec![
                    PathBuf::from("templates/archive-logs.toml"),
                    PathBuf::from("templates/ops-mix.toml"),
                ]
            } else {
                templates
            };
            let rt = super::sandbox::runtime()?;
            let cache = super::sandbox::cache()?;
            let mut all = Vec::new();
            for t in &templates {
                let t = engine::template::Template::load(t)?;
                all.extend(realism::measure_generated(
                    &rt, &cache, &t, opts.seed, count, &bases,
                )?);
            }
            if let Some(path) = save {
                let mut f = std::fs::File::create(&path)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                for g in &all {
                    writeln!(f, "{}", serde_json::to_string(g)?)?;
                }
            }
            all
        }
    };
    let rv: Vec<Vec<f32>> = real
        .iter()
        .map(|(_, f)| realism::realism_vector(f))
        .collect();
    let gv: Vec<Vec<f32>> = gen
        .iter()
        .map(|g| realism::realism_vector(&g.fingerprint))
        .collect();
    let report = realism::evaluate(&rv, &gv, opts)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", report.text());
    }
    Ok(0)
}
