//! The catalogue oracles: for every task, on the unperturbed instance and under every single
//! fault of the catalogue (default parameters, seed 1), the reactive catalogue oracle solves
//! every instance the free-text oracle solves, except the faults its task declares as gaps
//! ([`Task::catalogue_gaps`], each with its reason). The unperturbed instance is never a gap.
//!
//! [`Task::catalogue_gaps`]: engine::tasks::Task::catalogue_gaps

use crate::common;
use engine::certify::{all_defaults, check, CheckSpec};

#[test]
fn the_catalogue_oracle_solves_what_the_oracle_solves_under_every_single_fault() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let mut failures = Vec::new();
    let mut shares = Vec::new();
    for task in engine::tasks::all() {
        let name = task.name();
        let spec = CheckSpec {
            task: name.into(),
            base: "host".into(),
            singles: all_defaults(),
            combos: 0,
            seeds: vec![1],
            workers: 2,
        };
        let rows = check(&rt, &cache, &spec);
        let none = &rows[0];
        assert_eq!(none.perturbations, "none");
        if none.status != "solvable" || none.catalogue_solvable != Some(true) {
            failures.push(format!(
                "{name}: the unperturbed instance: oracle {} ({}), catalogue {:?} ({}) after {:?}",
                none.status,
                none.reason,
                none.catalogue_solvable,
                none.catalogue_reason,
                none.catalogue_actions
            ));
        }
        let gaps = task.catalogue_gaps();
        let (mut solvable, mut by_catalogue) = (0, 0);
        for r in rows.iter().filter(|r| r.status == "solvable") {
            solvable += 1;
            let fault = r.perturbations.split(':').next().unwrap_or("");
            if r.catalogue_solvable == Some(true) {
                by_catalogue += 1;
                if let Some((g, _)) = gaps.iter().find(|(g, _)| *g == fault) {
                    failures.push(format!("{name}: `{g}` is declared a gap but was solved"));
                }
            } else if !gaps.iter().any(|(g, _)| *g == fault) {
                failures.push(format!(
                    "{name} under {}: the catalogue oracle failed: {} after {:?}",
                    r.perturbations, r.catalogue_reason, r.catalogue_actions
                ));
            }
        }
        shares.push(format!(
            "{name}: {by_catalogue} of {solvable} solvable instances solved through the catalogue"
        ));
    }
    eprintln!("{}", shares.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
