//! What an agent reads: control characters of a command's output are escaped (tabs and
//! newlines kept), and a command holding a NUL is refused before the engine wraps it, so the
//! engine's own wrapper never shows.

use crate::common;

use engine::env::{Action, Env, EnvConfig};
use engine::instance::Plan;

#[test]
fn observations_escape_control_characters_and_never_show_the_wrapper() {
    require_root!();
    let mut e = Env::new(common::runtime(), common::cache(), EnvConfig::default()).unwrap();
    e.reset(&Plan::for_task("archive-logs", 3, vec![])).unwrap();
    let s = e
        .step(&Action::Command(
            r"printf 'a\000b\033[31mred\tc\nd'; printf 'e\007' >&2".into(),
        ))
        .unwrap();
    let o = &s.observation;
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    assert_eq!(o.stdout, "a\\x00b\\x1b[31mred\tc\nd");
    assert_eq!(o.stderr, "e\\x07");
    assert!(
        !o.text.contains('\u{1b}') && !o.text.contains('\0'),
        "{}",
        o.text
    );
    let s = e.step(&Action::Command("echo a\0; echo b".into())).unwrap();
    let o = &s.observation;
    assert_eq!(o.exit_code, Some(2), "{o:?}");
    assert_eq!(o.stderr, "refused: a NUL byte in the command");
    assert!(!s.info.infra_failure);
    assert!(o.text.contains("$ echo a\\x00; echo b"), "{}", o.text);
    // The next command runs as usual.
    let s = e.step(&Action::Command("echo ok".into())).unwrap();
    assert_eq!(s.observation.stdout, "ok\n");
}

/// What the verifier and the observation read after a command rides on the next one
/// (`engine/looks.rs`). Those answers are the state after that command: a file it made is in
/// the listing at once, the listing and disk usage are those asked afresh, and the command that
/// makes the archive is judged solved on its own step (the verifier's read of the archive came
/// with it).
#[test]
fn reads_that_ride_on_a_command_see_its_effects() {
    require_root!();
    let mut e = Env::new(common::runtime(), common::cache(), EnvConfig::default()).unwrap();
    let plan = Plan::for_task("archive-logs", 3, vec![]);
    e.reset(&plan).unwrap();
    let s = e.step(&Action::Command("touch fresh-file".into())).unwrap();
    let o = &s.observation;
    assert!(o.listing.contains(&"fresh-file".to_string()), "{o:?}");
    let running = e.running().unwrap();
    let answered = running.looks_answered();
    // The verifier's read of the archive and the overview.
    assert!(answered >= 2, "{answered} answered with the command");
    let shown = |o: sandbox::protocol::Overview| {
        (
            engine::env::listing(o.entries.unwrap_or_default()),
            o.upper_bytes,
        )
    };
    let fresh = shown(running.sandbox_mut().overview(&o.cwd, 64).unwrap());
    assert_eq!(fresh, (o.listing.clone(), o.disk.used_bytes));
    // The next episode's start state: its verifier's read and its overview came with the
    // reset, answered on the fresh state (the file is gone), as a fresh request answers.
    let reset = e.reset(&plan).unwrap();
    assert!(
        !reset.listing.contains(&"fresh-file".to_string()),
        "{reset:?}"
    );
    let running = e.running().unwrap();
    let at_reset = running.looks_answered();
    assert!(at_reset >= answered + 2, "{answered} then {at_reset}");
    let fresh = shown(running.sandbox_mut().overview(&reset.cwd, 64).unwrap());
    assert_eq!(fresh, (reset.listing.clone(), reset.disk.used_bytes));
    // A last step that ended elsewhere: the reset still brings the start directory's overview
    // (the agent starts there again), and the verifier's read.
    let s = e
        .step(&Action::Command(
            "mkdir -p /tmp/elsewhere && cd /tmp/elsewhere && touch there".into(),
        ))
        .unwrap();
    assert_eq!(s.observation.cwd, "/tmp/elsewhere");
    assert_eq!(s.observation.listing, ["there"]);
    let answered = e.running().unwrap().looks_answered();
    let again = e.reset(&plan).unwrap();
    assert_eq!((&again.cwd, &again.listing), (&reset.cwd, &reset.listing));
    let running = e.running().unwrap();
    let at_reset = running.looks_answered();
    assert_eq!(at_reset, answered + 2, "the read and the overview");
    assert_eq!(running.cwd, reset.cwd);
    let fresh = shown(running.sandbox_mut().overview(&again.cwd, 64).unwrap());
    assert_eq!(fresh, (again.listing.clone(), again.disk.used_bytes));
    let answered = at_reset;
    let first = e.reset(&plan).unwrap();
    let mut oracle = engine::agents::Oracle::default();
    let p = engine::episode::play(&mut e, &first, &mut oracle, &mut |_, _| {}).unwrap();
    assert!(p.success && p.steps == 1, "{p:?}");
    assert!(e.running().unwrap().looks_answered() > answered);
}

/// A reset followed by start steps carries no looks: free-disk's start step fills the disk
/// after the reset, and the start state's observation must show the disk filled (answers taken
/// at the reset would show it empty).
#[test]
fn a_reset_with_start_steps_after_it_is_observed_after_them() {
    require_root!();
    let mut e = Env::new(common::runtime(), common::cache(), EnvConfig::default()).unwrap();
    let plan = Plan::for_task("free-disk", 3, vec![]);
    e.reset(&plan).unwrap();
    e.step(&Action::Command("true".into())).unwrap();
    let answered = e.running().unwrap().looks_answered();
    let o = e.reset(&plan).unwrap();
    let running = e.running().unwrap();
    assert_eq!(
        running.looks_answered(),
        answered,
        "nothing came with the reset"
    );
    let fresh = running.sandbox_mut().overview(&o.cwd, 64).unwrap();
    assert_eq!(fresh.upper_bytes, o.disk.used_bytes);
    assert!(o.disk.used_bytes > o.disk.size_bytes / 2, "{:?}", o.disk);
}
